"""The training loop and what it needs to run anywhere: backends (DDP, DeepSpeed, FSDP through
accelerate), checkpoints that survive preemption, and the preemption signal itself."""
