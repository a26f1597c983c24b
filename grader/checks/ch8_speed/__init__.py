"""Chapter 8, masks at speed: ``tiled_attention`` (:mod:`.forward`) and ``tiled_attention_backward``
(:mod:`.backward`), their inputs (:mod:`.inputs`).
"""
