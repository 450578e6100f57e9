"""``plait generate``: sample text from a plait checkpoint (any layout) or a Hugging Face model directory."""

from __future__ import annotations

HELP = "sample text from a checkpoint or a Hugging Face model directory (one process, CPU or GPU)"


def add_arguments(parser) -> None:
    from plait.run.sampling import SamplingOptions

    defaults = SamplingOptions()
    parser.add_argument("--checkpoint", required=True, metavar="CKPT",
                        help="a checkpoint directory (step_NNNNNNNN), a --checkpoint-dir (its newest valid one), "
                             "or a Hugging Face model directory (config.json + safetensors)")
    parser.add_argument("--prompt", required=True, help="the text to continue")
    parser.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens, metavar="N",
                        help=f"tokens to sample (default {defaults.max_new_tokens}; fewer when the end-of-text "
                             "token comes)")
    parser.add_argument("--temperature", type=float, default=defaults.temperature,
                        help=f"logits are divided by it (default {defaults.temperature}; 0: greedy)")
    parser.add_argument("--top-k", type=int, default=defaults.top_k, metavar="K",
                        help="sample among the K most likely tokens (default 0: all)")
    parser.add_argument("--top-p", type=float, default=defaults.top_p, metavar="P",
                        help="sample among the most likely tokens whose probabilities add up to P, in (0, 1] "
                             "(default 1: all)")
    parser.add_argument("--seed", type=int, default=defaults.seed,
                        help=f"the sampling generator's seed (default {defaults.seed}): the same seed, the same text")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="where the model runs (default auto: the GPU when torch sees one)")
    parser.add_argument("--tokenizer", metavar="NAME",
                        help="tokenize with this: bytes, tiktoken:NAME, or a tokenizer.json or its directory "
                             "(default: the run's, from its token file; a Hugging Face directory's own)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object (prompt and new token ids, text) instead of the text")


def run(args) -> int:
    import json

    from plait.run.generate import generate
    from plait.run.sampling import SamplingOptions

    options = SamplingOptions(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                              top_p=args.top_p, seed=args.seed)
    done = generate(args.checkpoint, args.prompt, options, device=args.device, tokenizer=args.tokenizer)
    if args.json:
        print(json.dumps({"checkpoint": done.source, "tokenizer": done.tokenizer, "prompt_ids": done.prompt_ids,
                          "new_ids": done.new_ids, "text": done.text, "stopped_at_eos": done.stopped_at_eos}))
    else:
        print(args.prompt + done.text)
    return 0
