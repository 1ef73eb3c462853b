"""Continuous batching: the requests inside the engine (`request`), the
scheduler that plans each step (`scheduler`), and what a step's plan and
result carry between it and the model runner (`output`)."""
