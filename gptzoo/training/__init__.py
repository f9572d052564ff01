"""Training: token data (data), the loop (trainer), AdamW and its schedule (optim), torchrun
processes (distributed), a run's directory (run_dir), progress (display) and loss plots (plot)."""
