/* proto/frame: the worker pipe's length-prefixed frames, as megad reads a
 * worker's (WorkerFrame) and a worker reads megad's (DaemonFrame). The
 * first byte picks the direction and how the bytes are cut into reads;
 * however they are cut, the same frames come out, and the same as the
 * worker's blocking reader gets. */
#include <fcntl.h>
#include <unistd.h>

#include "proto/frame.h"
#include "proto/mega.pb-c.h"
#include "fuzz.h"

/* Decodes data in chunks of at most `chunk` bytes; returns how many frames
 * came out, and whether the stream failed. */
static size_t decode(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t size,
                     size_t chunk, bool *failed) {
  mega_frame_decoder d;
  mega_frame_decoder_init(&d, desc, 0);
  mega_err err = {0};
  size_t frames = 0;
  *failed = false;
  for (size_t off = 0; off < size && !*failed;) {
    size_t n = size - off < chunk ? size - off : chunk;
    if (mega_frame_decoder_feed(&d, data + off, n, &err) != MEGA_OK) {
      *failed = true;
      break;
    }
    off += n;
    for (;;) {
      ProtobufCMessage *m = NULL;
      if (mega_frame_decoder_next(&d, &m, &err) != MEGA_OK) {
        FUZZ_CHECK(err.msg[0]);
        *failed = true;
        break;
      }
      if (!m) break;
      FUZZ_CHECK(m->descriptor == desc);
      /* what decoded encodes again */
      uint8_t *buf = NULL;
      size_t len = 0;
      FUZZ_CHECK(mega_frame_encode(m, 0, &buf, &len, &err) == MEGA_OK);
      free(buf);
      protobuf_c_message_free_unpacked(m, NULL);
      frames++;
    }
  }
  if (!*failed && mega_frame_decoder_end(&d, &err) != MEGA_OK) *failed = true;
  mega_frame_decoder_free(&d);
  return frames;
}

/* The worker's blocking reader over a file of the same bytes: frames until
 * the end or the first bad one. */
static size_t read_all(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t size) {
  int fd = open(fuzz_file("frames", data, size), O_RDONLY);
  FUZZ_CHECK(fd >= 0);
  size_t frames = 0;
  for (;;) {
    ProtobufCMessage *m = NULL;
    mega_err err = {0};
    if (mega_frame_read(fd, desc, 0, &m, &err) != MEGA_OK) {
      FUZZ_CHECK(err.msg[0] && !m);
      break;
    }
    if (!m) break;
    protobuf_c_message_free_unpacked(m, NULL);
    frames++;
  }
  close(fd);
  return frames;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const ProtobufCMessageDescriptor *desc =
      data[0] & 1 ? &mega__v1__daemon_frame__descriptor : &mega__v1__worker_frame__descriptor;
  size_t chunk = 1 + (data[0] >> 1);
  bool f1, f2;
  size_t whole = decode(desc, data + 1, size - 1, size, &f1);
  size_t cut = decode(desc, data + 1, size - 1, chunk, &f2);
  FUZZ_CHECK(f1 == f2 && whole == cut);
  FUZZ_CHECK(read_all(desc, data + 1, size - 1) == whole);
  return 0;
}
