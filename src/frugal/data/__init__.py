"""Reading training data: rows from files, examples tokenized as `frugal train` sees them,
packing and batching. Used by `frugal plan --dataset`, `frugal data check` and `frugal train`."""
