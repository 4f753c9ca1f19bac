"""STUB: being written; replace this whole file."""

def fake_quantize_per_tensor_affine(*args, **kwargs):  # STUB
    raise NotImplementedError

def fake_quantize_per_tensor_affine_cachemask(*args, **kwargs):  # STUB
    raise NotImplementedError

def fake_quantize_per_channel_affine(*args, **kwargs):  # STUB
    raise NotImplementedError

def fake_quantize_per_channel_affine_cachemask(*args, **kwargs):  # STUB
    raise NotImplementedError

def fake_quantize_backward(*args, **kwargs):  # STUB
    raise NotImplementedError

def fake_quantize_learnable_per_tensor_affine(*args, **kwargs):  # STUB
    raise NotImplementedError

def fake_quantize_learnable_per_tensor_affine_backward(*args, **kwargs):  # STUB
    raise NotImplementedError

def fake_quantize_learnable_per_channel_affine(*args, **kwargs):  # STUB
    raise NotImplementedError

def fake_quantize_learnable_per_channel_affine_backward(*args, **kwargs):  # STUB
    raise NotImplementedError

