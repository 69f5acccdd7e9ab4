"""Running a plan: the run config (shared with `frugal plan --write`) and the trainer."""
