"""The worker side of the engine: each rank's model shard and runner, the sampler, the
executors that run a step on one process or over tensor-parallel worker processes, CUDA
graphs and memory profiling. The engine core (engine/core/) never imports it."""
