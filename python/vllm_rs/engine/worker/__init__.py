"""The model runners, one per kind of model: `model_runner` (the toy and real
decoders over the paged KV cache, with `native_step`, the whole decoder in
one native call), `pooling_runner` (embedding and classification models) and
`echo_runner` (no model). A runner executes a step's plan and keeps its own
state of each request (`request_state`)."""
