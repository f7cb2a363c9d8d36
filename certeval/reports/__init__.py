"""What reads a run back: the report and its plots, rescoring, the cost preview."""
