"""Chapter 12, masks in the architectures of 2025–26: the checks of its four exercises
(:mod:`.architectures`) and their inputs (:mod:`.inputs`).
"""
