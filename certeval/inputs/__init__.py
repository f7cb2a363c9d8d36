"""What a run reads: item banks, recorded scores, history sources, model specs, model folders and fingerprints, the bundled small model."""
