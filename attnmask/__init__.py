"""attnmask: attention masking, explained and graded.

Masks are ``torch.bool`` tensors with **True = may attend** (the PyTorch SDPA
convention). Shape letters: B batch, H heads, Lq queries, Lk keys, L when equal,
D model width, d head width.
"""

from .attention import Plan, attention, attention_plan
from .cache import KVCache, kv_cache_attention
from .influence import influence_matrix
from .masks import (
    broadcast_mask,
    causal_mask,
    combine_masks,
    decoder_mask,
    document_mask,
    encoder_decoder_masks,
    padding_mask,
    prefix_lm_mask,
    sliding_window_mask,
    to_additive,
)
from .mha import MultiHeadAttention, multi_head_attention
from .models import ModelConfig, TinyDecoder, TinyEncoderDecoder, train_steps
from .predicates import (
    and_masks,
    block_mask,
    causal,
    document,
    key_padding,
    kind_of,
    materialize,
    or_masks,
    prefix_lm,
    sliding_window,
)
from .real_models import (
    alibi_bias,
    alibi_slopes,
    generate_left_padded,
    gqa_attention,
    left_padding_position_ids,
    packed_labels,
    packed_position_ids,
)
from .serving import (
    PagedKVCache,
    RollingKVCache,
    decoder_logits,
    gather_blocks,
    image_blocks,
    image_text_mask,
    paged_attention,
    rolling_cache_mask,
    rolling_slot_positions,
    tree_ancestors,
    tree_mask,
    tree_positions,
)
from .softmax import masked_softmax
from .tiled import tiled_attention

__version__ = "0.1.0"

#: The functions of the exercise contract, in chapter order.
CONTRACT = (
    "causal_mask",
    "influence_matrix",
    "to_additive",
    "masked_softmax",
    "attention",
    "padding_mask",
    "decoder_mask",
    "encoder_decoder_masks",
    "multi_head_attention",
    "kv_cache_attention",
    "sliding_window_mask",
    "prefix_lm_mask",
    "document_mask",
    "tiled_attention",
    "left_padding_position_ids",
    "packed_labels",
    "gqa_attention",
    "alibi_bias",
    "image_text_mask",
    "rolling_cache_mask",
    "paged_attention",
    "tree_mask",
)

__all__ = [
    "CONTRACT",
    "KVCache",
    "ModelConfig",
    "MultiHeadAttention",
    "PagedKVCache",
    "Plan",
    "RollingKVCache",
    "TinyDecoder",
    "TinyEncoderDecoder",
    "alibi_bias",
    "alibi_slopes",
    "and_masks",
    "attention",
    "attention_plan",
    "block_mask",
    "broadcast_mask",
    "causal",
    "causal_mask",
    "combine_masks",
    "decoder_logits",
    "gather_blocks",
    "decoder_mask",
    "document",
    "document_mask",
    "encoder_decoder_masks",
    "generate_left_padded",
    "gqa_attention",
    "image_blocks",
    "image_text_mask",
    "influence_matrix",
    "key_padding",
    "kind_of",
    "kv_cache_attention",
    "left_padding_position_ids",
    "masked_softmax",
    "materialize",
    "multi_head_attention",
    "or_masks",
    "packed_labels",
    "packed_position_ids",
    "padding_mask",
    "paged_attention",
    "prefix_lm",
    "prefix_lm_mask",
    "rolling_cache_mask",
    "rolling_slot_positions",
    "sliding_window",
    "sliding_window_mask",
    "to_additive",
    "tiled_attention",
    "train_steps",
    "tree_ancestors",
    "tree_mask",
    "tree_positions",
]
