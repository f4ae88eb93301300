"""Test and benchmark tooling that is not part of the product."""
