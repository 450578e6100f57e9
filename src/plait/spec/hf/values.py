"""Config values that change a model's outputs, that no ModelSpec field records, and that plait's
runtime has one way of (or none): the one declaration of what a config.json may ask for there.

``check_values`` applies ``VALUE_RULES`` to every config plait reads (``plait.spec.hf_config``), so
``plait plan --model config.json``, ``plait train --model config.json`` and ``--init-from`` refuse
the same configs, each with one line naming the key, its value and what plait runs. Each rule gives
transformers' value when the key is absent (transformers 5.24's config classes), and the values plait
accepts. A key transformers ignores for a family (DeepSeek-V3's ``scoring_func``, DeepSeek's
``moe_layer_freq``) is refused where the checkpoint's own code would compute another model
(DeepSeek-V3's code scores with a sigmoid only; DeepSeek's ``layer_idx % moe_layer_freq``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from plait.errors import PlaitError
from plait.spec.moe.parts import OAI_ALPHA, OAI_LIMIT

_MOE_SWIGLU = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v2", "deepseek_v3")
_DEEPSEEK = ("deepseek_v2", "deepseek_v3")


@dataclass(frozen=True)
class ValueRule:
    """``key`` of a ``families`` config: ``default`` when absent, one of ``accepted`` or refused."""

    families: tuple[str, ...]
    key: str
    default: object  # transformers' value when the config leaves the key out
    accepted: tuple  # the values plait's runtime computes as transformers does
    runs: str  # what plait runs instead, for the message

    def problem(self, config: dict) -> str | None:
        value = config.get(self.key, self.default)
        if any(_same(value, ok) for ok in self.accepted):
            return None
        return f"{self.key}={value!r} (plait's runtime runs {self.runs})"


def _same(value, accepted) -> bool:
    """``value == accepted``, with true, false and null equal only to themselves (JSON ``1`` is not ``true``)."""
    if isinstance(value, bool) or isinstance(accepted, bool) or value is None or accepted is None:
        return value is accepted
    return value == accepted


VALUE_RULES = (
    ValueRule(("gpt2", "gpt_bigcode"), "scale_attn_weights", True, (True,), "True"),
    ValueRule(("gpt_oss",), "swiglu_alpha", OAI_ALPHA, (OAI_ALPHA,), f"{OAI_ALPHA}: plait.spec.moe.parts' OAI_ALPHA"),
    ValueRule(("gpt_oss",), "swiglu_limit", OAI_LIMIT, (OAI_LIMIT,), f"{OAI_LIMIT}: plait.spec.moe.parts' OAI_LIMIT"),
    # transformers' GPT-OSS experts ignore hidden_act (their clamped SwiGLU is built in): no rule for it
    ValueRule(_MOE_SWIGLU, "hidden_act", "silu", ("silu", "swish"),
              "'silu': SwiGLU experts, shared experts and dense MLPs"),
    ValueRule(("deepseek_v3",), "rope_interleave", True, (True,),
              "True: its weight table permutes the interleaved rotary rows"),
    ValueRule(("deepseek_v3",), "scoring_func", "sigmoid", ("sigmoid",),
              "'sigmoid': DeepSeek-V3's router, as transformers' DeepseekV3TopkRouter always does"),
    ValueRule(("deepseek_v3",), "topk_method", "noaux_tc", ("noaux_tc", None),
              "'noaux_tc': the bias-balanced sigmoid router"),
    ValueRule(("deepseek_v2",), "scoring_func", "softmax", ("softmax",),
              "'softmax': DeepSeek-V2's router, as transformers' DeepseekV2TopkRouter always does"),
    ValueRule(("deepseek_v2",), "topk_method", "greedy", ("greedy", "group_limited_greedy"),
              "'greedy' or 'group_limited_greedy', as transformers' DeepseekV2TopkRouter does"),
    ValueRule(("deepseek_v2",), "norm_topk_prob", False, (False, None),
              "False: transformers' DeepSeek-V2 never renormalizes the top-k weights"),
    ValueRule(_DEEPSEEK, "moe_layer_freq", 1, (1,),
              "1: every layer after first_k_dense_replace, as transformers builds it; DeepSeek's own code "
              "would put experts on layer % moe_layer_freq == 0 only"),
    ValueRule(_DEEPSEEK, "attention_bias", False, (False,), "False: multi-head latent attention without biases"),
    ValueRule(("olmoe",), "clip_qkv", None, (None,), "None: Q, K and V unclipped"),
    ValueRule(("olmoe",), "sliding_window", None, (None,),
              "None: full attention (transformers' OLMoE slides only under flash attention)"),
    ValueRule(("mixtral",), "router_jitter_noise", 0.0, (0.0, None), "0.0: no noise on the router's input"),
    ValueRule((*_MOE_SWIGLU, "gpt_oss"), "attention_dropout", 0.0, (0.0, None), "0.0: no attention dropout"),
)


def value_problems(config: dict, family: str) -> list[str]:
    """``key=value (plait's runtime runs ...)`` for each rule of ``family`` that ``config`` breaks."""
    return [p for rule in VALUE_RULES if family in rule.families and (p := rule.problem(config))]


def check_values(config: dict, family: str, source: Path) -> None:
    """PlaitError naming the first value of ``config`` (model_type ``family``) that plait does not run."""
    problems = value_problems(config, family)
    if problems:
        raise PlaitError(f"{source}: {problems[0]}; it would compute another model than the config's")
