"""The model runners, one per kind of model: `model_runner` (the toy and real
decoders over the paged KV cache, staging each step with `step_inputs` and
computing it with an executor: `native_executor`, a GGUF's whole decoder in
one native call with no torch, or `torch_executor`, the torch modules,
themselves run as `native_step` where they can), `pooling_runner` (embedding
and classification models) and `echo_runner` (no model). A runner executes a
step's plan and keeps its own state of each request (`request_state`)."""
