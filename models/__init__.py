"""meshplan.models: how to build a model, shared by the profiler and the executor (docs/design.md,
"Dependency direction": contracts <- models <- profiler, executor).

- zoo: the built-in LayeredModels (GPT, Llama, BERT, MoE, ViT, ResNet), `zoo.build_model(name)`
- loader: `load_model(spec, overrides, device)` for zoo names, "file.py:factory" (user_models)
  and Hugging Face configs (hf)
- tp_rules: `tp_rules(model)`, the TPRule per layer FQN
- analytic: closed-form GPT/Llama ModelProfiles of published shapes (pure Python, no torch)
This file imports nothing, so that `meshplan.models.analytic` stays torch-free.
"""
