"""Built-in multimodal input processors (kind ``modality_processors``): LLaVA-1.5 and Qwen2-VL images."""
