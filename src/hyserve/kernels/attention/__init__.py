"""Causal attention of new query tokens over a paged KV cache (GQA), with the sigmoid output gate.

KV cache of one layer: ``k_cache, v_cache [num_blocks, block_size, Hkv, D]``. Token ``t`` of sequence
``i`` lives at flat slot ``block_tables[i, t // block_size] * block_size + t % block_size``. ``store_kv``
writes the new tokens' K/V first; ``paged_attention`` then reads every key of the context from the cache,
so the same op serves prefill, chunked prefill (a cached prefix) and decode.
"""

from hyserve.kernels.attention.reference import paged_attention_reference, store_kv_reference

paged_attention = paged_attention_reference
store_kv = store_kv_reference

__all__ = ["paged_attention", "paged_attention_reference", "store_kv", "store_kv_reference"]
