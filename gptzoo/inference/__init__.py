"""Inference: KV-cached batched decoding (generate), the sampler chain (sampling) and the batch-1
CPU matrix-vector path (matvec)."""
