"""The KV cache's bookkeeping: the block pool (`block_pool`), the prefix
hashes of full blocks (`prefix_hash`) and the manager between them and the
scheduler (`kv_cache_manager`: a request's blocks, prefix-cache lookups and
their counts)."""
