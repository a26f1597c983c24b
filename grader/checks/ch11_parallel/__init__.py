"""Chapter 11, masks across kernels and devices: ``attention_lse`` and ``merge_partials`` (:mod:`.lse`),
the ring (:mod:`.ring`), cascade decoding (:mod:`.cascade`), the chunked masks (:mod:`.chunked`), and the
chapter's classic mistakes (:mod:`.mistakes`).
"""
