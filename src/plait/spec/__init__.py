"""What is trained and on what, as plain frozen dataclasses. Never imports torch.

  model.py         ModelSpec: one transformer's shape and features
  models.py        model presets by name, and reading a model from a preset, config.json or plait JSON
  hf_config.py     a Hugging Face config.json -> ModelSpec (with hf/ for the families' keys)
  hf/              Hugging Face families, transformers' reader and the config.json writer
  moe/             the mixture-of-experts parts of a ModelSpec, their counts, presets and placement
  hardware.py      GPUs, links and clusters (presets); GPU generations
  gpu_names.py     GPU names as sources write them -> preset names
  units.py         GIB, DEFAULT_GPU and the other shared units
  layout.py        Layout, JobSpec and the ranks' placement; each layout key declared once
  layout_keys.py   the key-declaration machinery behind layout_key
  ckpt.py          the activation-checkpoint policies and the ckpt=POLICY[:LAYERS] syntax
  validate.py      the planner's rules a layout must follow, each with an id
  capabilities.py  what plait train runs, as rules with ids
  stack.py         software stacks as data (Stack, the stack TOML reader)
  serialize.py     loading plain-data specs from dicts and JSON with clear errors
"""
