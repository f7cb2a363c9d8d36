"""Models hosted as long-lived Ray actors (replay, hf, vllm, openai) and the pool that keeps them busy."""
