"""What ``plait train`` trains: the flags that say it (``TargetSettings``) and, read once, the typed
``TrainTarget`` (the ``--plan`` file read and the ``--layout`` text parsed one time each; no torch).
"""

from __future__ import annotations

from dataclasses import dataclass

from plait.errors import PlaitError
from plait.run.config import plan_parts
from plait.run.launcher.micro_batch import mbs_given
from plait.run.settings import setting
from plait.spec.layout import JobSpec, Layout
from plait.spec.model import ModelSpec


@dataclass(frozen=True)
class TargetSettings:
    """What to train, as the command line says it: a saved plan, or model + layout + batch."""

    plan: str | None = setting(None, "--plan", "plan file written by plait plan --save", "what")
    model: str | None = setting(None, "--model", "model preset, config.json or model JSON", "what")
    layout: str | None = setting(None, "--layout", 'e.g. "dp=2,tp=2,pp=2,zero=3,ckpt=selective" (default: dp over '
                                 "all processes)", "what")
    global_batch: int | None = setting(None, "--global-batch", "sequences per optimizer step", "what")
    seq_len: int | None = setting(None, "--seq-len", "tokens per sequence", "what")  # tokens


@dataclass(frozen=True)
class TrainTarget:
    """What to train, read once: the plan's model, layout, batch and GPU, or ``--model``'s and ``--layout``'s.

    ``None`` is "not said": no ``--model`` (a fresh run may take ``--init-from``'s), no layout (dp over
    all processes; a resumed run keeps the saved one), no batch size. Sizes in sequences and tokens."""

    plan: str | None = None  # the plan file's path
    model: ModelSpec | None = None
    layout: Layout | None = None
    mbs_given: bool = False  # the layout fixes the micro-batch (a plan's does; a --layout text when it writes mbs)
    global_batch: int | None = None  # sequences per optimizer step (--global-batch, else the plan's)
    seq_len: int | None = None  # tokens per sequence (--seq-len, else the plan's)
    gpu: str | None = None  # the plan's GPU spec
    plan_job: JobSpec | None = None  # the plan's own batch (a resumed run must keep it)
    attn_given: bool = False  # the layout names its attention kernel (a plan's does)

    def layout_for(self, model: ModelSpec, world_size: int) -> Layout:
        """The layout to train: the one said (dp over ``world_size`` processes without one), with
        the attention kernel the runtime runs ``model`` with when the layout does not name one
        (``plait.plan.attention_choice.runnable_attention``: flex for sinks or soft-capped scores)."""
        from plait.plan.attention_choice import runnable_attention

        layout = self.layout or Layout(dp=world_size)
        if self.attn_given:
            return layout
        return layout.variant(attn=runnable_attention(model, layout.attn))

    @classmethod
    def read(cls, request) -> TrainTarget:
        """The target of ``request`` (its ``TargetSettings`` flags); one-line PlaitError for a bad plan,
        model or layout, or a plan given with a ``--layout`` or another ``--model``."""
        from plait.plan.complete import given_keys
        from plait.spec.models import get_model

        if request.plan:
            from plait.plan.plan import load_plan

            model, layout, job, gpu = plan_parts(load_plan(request.plan), request.plan)
            if request.model and get_model(request.model) != model:
                raise PlaitError(f"{request.plan} is a plan for model {model.name}, not {request.model}")
            if request.layout:
                raise PlaitError("give either --plan or --layout, not both (the plan holds the layout)")
            return cls(request.plan, model, layout, True, request.global_batch or job.global_batch,
                       request.seq_len or job.seq_len, gpu, job, attn_given=True)
        layout = Layout.parse(request.layout) if request.layout else None
        model = get_model(request.model) if request.model else None
        attn_given = bool(request.layout) and "attn" in given_keys(request.layout)
        return cls(None, model, layout, mbs_given(request.layout), request.global_batch, request.seq_len,
                   attn_given=attn_given)

    @property
    def world_size(self) -> int | None:
        """The processes the layout asks for (None: no layout said; the default process count follows)."""
        return self.layout.world_size if self.layout is not None else None
