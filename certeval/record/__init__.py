"""results.json as a typed, versioned record, and the look log (docs/architecture.md §5)."""
