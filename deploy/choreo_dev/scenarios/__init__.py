"""Scale, fault and bad-input scenarios on throw-away local clusters (tests and soak)."""
