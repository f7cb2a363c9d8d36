"""Other harnesses' formats: lm-eval tasks as banks, their YAML and request flags, lm-eval's output trees and results blocks, readers of lm-eval and Inspect results, certeval inside Inspect."""
