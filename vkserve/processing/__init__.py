"""Images in, meaning out: a model's ``[preprocess]`` (images into its input tensor) and
``[postprocess]`` (its outputs as classes, boxes or a mask), from its ``config.toml``."""
