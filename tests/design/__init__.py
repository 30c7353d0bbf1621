"""Tests that type in the design documents' code examples (see README.md here for the index)."""
