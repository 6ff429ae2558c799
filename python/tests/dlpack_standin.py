"""Stand-ins for the arrays a trainer passes without torch installed.

``DLPackOnly`` exposes nothing but ``__dlpack__`` and
``__dlpack_device__``, the way a PyTorch tensor is read. Its capsule is
built here with ctypes (an unversioned DLManagedTensor, as torch exports
by default), so its dtype can be one NumPy cannot export, such as
bfloat16, and its device can claim to be a GPU.
"""

import ctypes

import numpy as np

KDL_CPU, KDL_CUDA = 1, 2
KDL_INT, KDL_UINT, KDL_FLOAT, KDL_BFLOAT, KDL_COMPLEX = 0, 1, 2, 4, 5


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                            ("deleter", _Deleter)]

_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class DLPackOnly:
    """A tensor seen only through DLPack: ``array``'s memory, described as
    ``(code, bits)`` on ``device``, with element ``strides`` (None:
    C-contiguous). ``deleted`` counts the consumer's deleter calls."""

    def __init__(self, array, code=None, bits=None, device=KDL_CPU, strides=None, shape=None,
                 requires_grad=False):
        self.array = array
        self.code = code
        self.bits = bits
        self.device = device
        self.strides = strides
        self.shape = tuple(array.shape if shape is None else shape)
        self.requires_grad = requires_grad
        self.deleted = 0
        self._keep = []

    def detach(self):
        return DLPackOnly(self.array, self.code, self.bits, self.device, self.strides, self.shape)

    def __dlpack_device__(self):
        return (self.device, 0)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        if self.requires_grad:
            raise RuntimeError("Can't export tensors that require gradient, use tensor.detach()")
        if self.code is None:  # the array's own export, as NumPy does it
            return self.array.__dlpack__()
        ndim = len(self.shape)
        shape = (ctypes.c_int64 * max(ndim, 1))(*self.shape)
        strides = None
        if self.strides is not None:
            strides = (ctypes.c_int64 * max(ndim, 1))(*self.strides)
        managed = DLManagedTensor()
        managed.dl_tensor.data = self.array.ctypes.data
        managed.dl_tensor.device = DLDevice(self.device, 0)
        managed.dl_tensor.ndim = ndim
        managed.dl_tensor.dtype = DLDataType(self.code, self.bits, 1)
        managed.dl_tensor.shape = shape
        managed.dl_tensor.strides = (ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
                                     if strides is not None else None)
        managed.dl_tensor.byte_offset = 0

        def deleter(_):
            self.deleted += 1

        managed.deleter = _Deleter(deleter)
        self._keep.append((managed, shape, strides, managed.deleter))
        return _PyCapsule_New(ctypes.addressof(managed), b"dltensor", None)
