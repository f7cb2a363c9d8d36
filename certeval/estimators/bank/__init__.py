"""Bank-target statistics of many models on one shared item order: without-replacement betting confidence sequences for pairs, ε-listings, rankings, selections, precision."""
