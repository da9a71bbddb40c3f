"""The machinery every topic shares: GPU or simulator, launching, inputs, validation, source and analysis."""
