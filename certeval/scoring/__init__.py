"""How a model's output becomes a score: certeval's scorers, lm-eval's gold rule, metrics and generate_until scoring."""
