/* Worker pipe framing: a 4-byte little-endian length, then the packed
 * protobuf message (WorkerFrame from megaw, DaemonFrame from megad).
 *
 * The daemon side reads through libuv, which hands over arbitrary chunks:
 * feed them to a mega_frame_decoder and take whole messages out with
 * mega_frame_decoder_next until it gives NULL. The worker side uses the
 * blocking mega_frame_read / mega_frame_write on its fds.
 *
 * A length above the limit, a truncated frame or bytes that do not parse are
 * errors with a sentence, never a crash or an allocation beyond the limit.
 * After an error the stream is out of step, so a decoder stays failed. */
#ifndef MEGA_PROTO_FRAME_H
#define MEGA_PROTO_FRAME_H

#include <stddef.h>
#include <stdint.h>
#include <protobuf-c/protobuf-c.h>

#include "core/status.h"

#define MEGA_FRAME_HEADER_BYTES 4u
/* Bigger than any step report with trace spans; small enough that garbage
 * cannot make us allocate much. */
#define MEGA_FRAME_MAX_DEFAULT (16u << 20)

/* Packs msg as one frame into a new buffer (*buf, the caller frees it).
 * max 0 means MEGA_FRAME_MAX_DEFAULT. */
mega_status mega_frame_encode(const ProtobufCMessage *msg, size_t max, uint8_t **buf,
                              size_t *len, mega_err *err);

/* A plain value; the caller owns it and calls mega_frame_decoder_free. */
typedef struct mega_frame_decoder {
  const ProtobufCMessageDescriptor *desc;
  size_t max;
  uint8_t *buf;     /* unconsumed bytes live in buf[off, len) */
  size_t off, len, cap;
  mega_err failed;  /* status MEGA_OK until the stream went bad */
} mega_frame_decoder;

/* desc is the type of every frame (mega__v1__worker_frame__descriptor);
 * max 0 means MEGA_FRAME_MAX_DEFAULT. */
void mega_frame_decoder_init(mega_frame_decoder *d, const ProtobufCMessageDescriptor *desc,
                             size_t max);
void mega_frame_decoder_free(mega_frame_decoder *d);

/* Appends a chunk. The decoder keeps only what next() has not consumed, so
 * drain it with next() after every feed. */
mega_status mega_frame_decoder_feed(mega_frame_decoder *d, const void *data, size_t n,
                                    mega_err *err);

/* Takes the next whole frame: *msg (the caller's, freed with
 * protobuf_c_message_free_unpacked) or NULL when more bytes are needed. */
mega_status mega_frame_decoder_next(mega_frame_decoder *d, ProtobufCMessage **msg,
                                    mega_err *err);

/* At end of input: fails if part of a frame is left over. */
mega_status mega_frame_decoder_end(mega_frame_decoder *d, mega_err *err);

/* Bytes buffered and not yet returned as frames. */
size_t mega_frame_decoder_pending(const mega_frame_decoder *d);

/* Blocking, for the worker: writes one frame (all of it, retrying on EINTR
 * and short writes). Ignore SIGPIPE in the process, so a closed pipe is an
 * error here rather than a signal. Not safe for two threads on one fd at
 * once: hold a lock around it. */
mega_status mega_frame_write(int fd, const ProtobufCMessage *msg, size_t max, mega_err *err);

/* Blocking: reads exactly one frame of type desc. *msg is NULL with MEGA_OK
 * when the other end closed the pipe between frames. */
mega_status mega_frame_read(int fd, const ProtobufCMessageDescriptor *desc, size_t max,
                            ProtobufCMessage **msg, mega_err *err);

#endif
