//! Model conversion: GGUF to mlx-lm directories, quantization.
