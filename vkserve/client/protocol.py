"""The wire protocol in one import, for the daemon and other servers: framing, schema, tensors.

Everything here is sans-I/O (bytes in, events out; objects in, bytes out). A server loop::

    decoder = FrameDecoder(max_frame_size)
    decoder.feed(chunk)              # FrameTooLarge: send an error frame (id 0), close
    msg = decoder.next_message()     # MalformedFrame: answer BAD_REQUEST to id 0, continue
    req = parse_request(msg)         # BadRequest: answer BAD_REQUEST to exc.request_id or 0
    frame = encode_frame(Response.success(req.id, encode_infer_result(outputs)).to_message())
"""

from .framing import (
    DEFAULT_MAX_FRAME_SIZE,
    HEADER_SIZE,
    FrameDecoder,
    FrameError,
    FrameTooLarge,
    MalformedFrame,
    ProtocolError,
    encode_frame,
    unpack_payload,
)
from .messages import (
    CONNECTION_ERROR_ID,
    MAX_REQUEST_ID,
    PROTOCOL_VERSION,
    AuthRequest,
    BadRequest,
    BadResponse,
    CancelRequest,
    ErrorCode,
    ErrorInfo,
    InferReply,
    InferRequest,
    ListModelsRequest,
    LoadModelRequest,
    Op,
    PingRequest,
    Request,
    Response,
    SchemaError,
    StatusRequest,
    UnloadModelRequest,
    decode_infer_reply,
    decode_infer_result,
    encode_infer_result,
    parse_request,
    parse_response,
)
from .tensors import (
    ALLOWED_DTYPES,
    MAX_NDIM,
    TensorError,
    decode_tensor,
    decode_tensors,
    encode_tensor,
    encode_tensors,
)

__all__ = [
    "ALLOWED_DTYPES",
    "CONNECTION_ERROR_ID",
    "DEFAULT_MAX_FRAME_SIZE",
    "HEADER_SIZE",
    "MAX_NDIM",
    "MAX_REQUEST_ID",
    "PROTOCOL_VERSION",
    "AuthRequest",
    "BadRequest",
    "BadResponse",
    "CancelRequest",
    "ErrorCode",
    "ErrorInfo",
    "FrameDecoder",
    "FrameError",
    "FrameTooLarge",
    "InferRequest",
    "ListModelsRequest",
    "LoadModelRequest",
    "MalformedFrame",
    "Op",
    "PingRequest",
    "ProtocolError",
    "Request",
    "Response",
    "SchemaError",
    "StatusRequest",
    "TensorError",
    "UnloadModelRequest",
    "InferReply",
    "decode_infer_reply",
    "decode_infer_result",
    "decode_tensor",
    "decode_tensors",
    "encode_frame",
    "encode_infer_result",
    "encode_tensor",
    "encode_tensors",
    "parse_request",
    "parse_response",
    "unpack_payload",
]
