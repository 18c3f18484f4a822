#include "proto/frame.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static size_t limit(size_t max) { return max ? max : MEGA_FRAME_MAX_DEFAULT; }

static void put_le32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
  p[2] = (uint8_t)(v >> 16);
  p[3] = (uint8_t)(v >> 24);
}

static uint32_t get_le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static mega_status too_big(mega_err *err, const ProtobufCMessageDescriptor *desc, size_t n,
                           size_t max) {
  return mega_fail(err, MEGA_ERR_INVALID,
                   "a %s frame of %zu bytes exceeds the limit of %zu bytes (garbage on the pipe, "
                   "or a message that needs a bigger limit)",
                   desc->name, n, max);
}

mega_status mega_frame_encode(const ProtobufCMessage *msg, size_t max, uint8_t **buf,
                              size_t *len, mega_err *err) {
  *buf = NULL;
  *len = 0;
  max = limit(max);
  size_t n = protobuf_c_message_get_packed_size(msg);
  if (n > max || n > UINT32_MAX) return too_big(err, msg->descriptor, n, max);
  uint8_t *b = malloc(MEGA_FRAME_HEADER_BYTES + n);
  if (!b) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory encoding a %zu-byte frame", n);
  put_le32(b, (uint32_t)n);
  protobuf_c_message_pack(msg, b + MEGA_FRAME_HEADER_BYTES);
  *buf = b;
  *len = MEGA_FRAME_HEADER_BYTES + n;
  return MEGA_OK;
}

/* ---- incremental decoder ---- */

void mega_frame_decoder_init(mega_frame_decoder *d, const ProtobufCMessageDescriptor *desc,
                             size_t max) {
  memset(d, 0, sizeof *d);
  d->desc = desc;
  d->max = limit(max);
}

void mega_frame_decoder_free(mega_frame_decoder *d) {
  free(d->buf);
  d->buf = NULL;
  d->off = d->len = d->cap = 0;
}

size_t mega_frame_decoder_pending(const mega_frame_decoder *d) { return d->len - d->off; }

static mega_status stuck(mega_frame_decoder *d, mega_err *err) {
  if (err) *err = d->failed;
  return d->failed.status;
}

mega_status mega_frame_decoder_feed(mega_frame_decoder *d, const void *data, size_t n,
                                    mega_err *err) {
  if (d->failed.status != MEGA_OK) return stuck(d, err);
  if (n == 0) return MEGA_OK;
  size_t pending = d->len - d->off;
  if (d->off > 0 && d->len + n > d->cap) { /* reclaim consumed bytes first */
    memmove(d->buf, d->buf + d->off, pending);
    d->off = 0;
    d->len = pending;
  }
  if (d->len + n > d->cap) {
    size_t cap = d->cap ? d->cap : 4096;
    while (cap < d->len + n) cap *= 2;
    uint8_t *b = realloc(d->buf, cap);
    if (!b) {
      mega_fail(&d->failed, MEGA_ERR_NOMEM, "out of memory buffering %zu bytes of frames",
                d->len + n);
      return stuck(d, err);
    }
    d->buf = b;
    d->cap = cap;
  }
  memcpy(d->buf + d->len, data, n);
  d->len += n;
  return MEGA_OK;
}

mega_status mega_frame_decoder_next(mega_frame_decoder *d, ProtobufCMessage **msg,
                                    mega_err *err) {
  *msg = NULL;
  if (d->failed.status != MEGA_OK) return stuck(d, err);
  size_t pending = d->len - d->off;
  if (pending < MEGA_FRAME_HEADER_BYTES) return MEGA_OK;
  uint32_t n = get_le32(d->buf + d->off);
  if (n > d->max) { /* checked before waiting for the body: garbage stops here */
    too_big(&d->failed, d->desc, n, d->max);
    return stuck(d, err);
  }
  if (pending - MEGA_FRAME_HEADER_BYTES < n) return MEGA_OK;
  const uint8_t *body = d->buf + d->off + MEGA_FRAME_HEADER_BYTES;
  ProtobufCMessage *m = protobuf_c_message_unpack(d->desc, NULL, n, body);
  if (!m) {
    mega_fail(&d->failed, MEGA_ERR_INVALID, "a frame of %u bytes is not a valid %s", n,
              d->desc->name);
    return stuck(d, err);
  }
  d->off += MEGA_FRAME_HEADER_BYTES + n;
  if (d->off == d->len) d->off = d->len = 0;
  *msg = m;
  return MEGA_OK;
}

mega_status mega_frame_decoder_end(mega_frame_decoder *d, mega_err *err) {
  if (d->failed.status != MEGA_OK) return stuck(d, err);
  size_t pending = d->len - d->off;
  if (pending == 0) return MEGA_OK;
  if (pending < MEGA_FRAME_HEADER_BYTES)
    return mega_fail(err, MEGA_ERR_IO,
                     "the pipe closed in the middle of a frame header (%zu of 4 bytes)", pending);
  return mega_fail(err, MEGA_ERR_IO, "the pipe closed in the middle of a frame (%zu of %u bytes)",
                   pending - MEGA_FRAME_HEADER_BYTES, get_le32(d->buf + d->off));
}

/* ---- blocking, for the worker ---- */

mega_status mega_frame_write(int fd, const ProtobufCMessage *msg, size_t max, mega_err *err) {
  uint8_t *buf;
  size_t len;
  mega_status st = mega_frame_encode(msg, max, &buf, &len, err);
  if (st != MEGA_OK) return st;
  size_t done = 0;
  while (done < len) {
    ssize_t w = write(fd, buf + done, len - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      int e = errno;
      free(buf);
      if (e == EPIPE)
        return mega_fail(err, MEGA_ERR_IO, "cannot write a frame: the other end closed the pipe");
      return mega_fail(err, MEGA_ERR_IO, "cannot write a frame: %s", strerror(e));
    }
    done += (size_t)w;
  }
  free(buf);
  return MEGA_OK;
}

/* Reads exactly n bytes; *got tells how many arrived before EOF. */
static mega_status read_exact(int fd, uint8_t *p, size_t n, size_t *got, mega_err *err) {
  *got = 0;
  while (*got < n) {
    ssize_t r = read(fd, p + *got, n - *got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return mega_fail(err, MEGA_ERR_IO, "cannot read a frame: %s", strerror(errno));
    if (r == 0) return MEGA_OK;
    *got += (size_t)r;
  }
  return MEGA_OK;
}

mega_status mega_frame_read(int fd, const ProtobufCMessageDescriptor *desc, size_t max,
                            ProtobufCMessage **msg, mega_err *err) {
  *msg = NULL;
  max = limit(max);
  uint8_t hdr[MEGA_FRAME_HEADER_BYTES];
  size_t got;
  mega_status st = read_exact(fd, hdr, sizeof hdr, &got, err);
  if (st != MEGA_OK) return st;
  if (got == 0) return MEGA_OK; /* closed between frames */
  if (got < sizeof hdr)
    return mega_fail(err, MEGA_ERR_IO,
                     "the pipe closed in the middle of a frame header (%zu of 4 bytes)", got);
  uint32_t n = get_le32(hdr);
  if (n > max) return too_big(err, desc, n, max);
  uint8_t *body = malloc(n ? n : 1);
  if (!body) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory reading a %u-byte frame", n);
  st = read_exact(fd, body, n, &got, err);
  if (st == MEGA_OK && got < n)
    st = mega_fail(err, MEGA_ERR_IO, "the pipe closed in the middle of a frame (%zu of %u bytes)",
                   got, n);
  if (st == MEGA_OK) {
    *msg = protobuf_c_message_unpack(desc, NULL, n, body);
    if (!*msg)
      st = mega_fail(err, MEGA_ERR_INVALID, "a frame of %u bytes is not a valid %s", n,
                     desc->name);
  }
  free(body);
  return st;
}
