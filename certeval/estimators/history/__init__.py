"""What other models' recorded scores say about a new model: the prior, paired comparisons and rankings that learn from history."""
