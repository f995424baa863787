"""A trace-driven discrete-event simulator of vLLM serving agent sessions.

The engine (continuous batching, chunked prefill, a paged prefix cache, a host
tier, a shared pool, a router) is modelled here; the policies are the
project's own code, driven by the simulator's clock: the retention policy
through ``server_ext._engine.EngineRetention``, the host tier's replacement
policy through vLLM's own ``CPUOffloadingManager``. ``python -m
benchmarks.simulate`` is the command; ``docs/simulator.md`` states every
assumption.
"""
