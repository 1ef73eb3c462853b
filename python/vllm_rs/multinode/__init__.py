"""Engines on more than one host (docs/multi-node.md): the topology
(`topology.py`), the node channel (`node_channel.py`), the head's registry of nodes
(`node_registry.py`), `serve --headless` (`headless.py`) and engines as Ray
actors (`ray_engines.py`).
"""
