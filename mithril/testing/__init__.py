"""Testing tools that ship with Mithril: the structure-aware fuzzer (:mod:`mithril.testing.fuzz`)."""
