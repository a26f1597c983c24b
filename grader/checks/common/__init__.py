"""The judges every chapter shares: recipes and value judges (:mod:`.judges`), properties beyond values
(:mod:`.properties`), plain-value answers (:mod:`.answers`) and results merged from parts (:mod:`.merging`).
"""
