"""SAE training: config, schedule, trainer with checkpoints and resume, distributed runs."""
