/* The test server (testsrv.c) as a program, for interop.py.
 *
 *   rpc_test_server ADDR       serve; print "PORT <n>" once listening; a
 *                              clean shutdown on SIGTERM or SIGINT (exit 0)
 *   rpc_test_server --methods  print every method of both services:
 *                              "<path> unary|server_stream" */
#include <stdio.h>
#include <string.h>

#include "proto/mega_rpc.h"
#include "testsrv.h"

typedef struct app {
  uv_loop_t loop;
  uv_signal_t sigterm, sigint;
  mega_rpc_cq *cq;
  testsrv *srv;
  testsrv_stats stats;
  bool stopping;
} app;

static void cq_closed(void *arg) {
  app *a = arg;
  uv_close((uv_handle_t *)&a->sigterm, NULL);
  uv_close((uv_handle_t *)&a->sigint, NULL);
}

static void srv_down(void *arg) {
  app *a = arg;
  mega_rpc_cq_close(a->cq, cq_closed, a);
}

static void on_signal(uv_signal_t *h, int signum) {
  (void)signum;
  app *a = h->data;
  if (a->stopping) return;
  a->stopping = true;
  testsrv_shutdown(a->srv, 500, srv_down, a);
}

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "--methods") == 0) {
    const mega_rpc_method *const *tables[] = {mega_control_methods, mega_peer_methods};
    for (int t = 0; t < 2; t++)
      for (const mega_rpc_method *const *m = tables[t]; *m; m++)
        printf("%s %s\n", (*m)->path,
               (*m)->kind == MEGA_RPC_UNARY ? "unary" : "server_stream");
    return 0;
  }
  if (argc != 2) {
    fprintf(stderr, "usage: rpc_test_server ADDR | --methods\n");
    return 2;
  }
  static app a;
  mega_err err;
  uv_loop_init(&a.loop);
  if (mega_rpc_cq_new(&a.loop, &a.cq, &err) != MEGA_OK) {
    fprintf(stderr, "rpc_test_server: %s\n", err.msg);
    return 1;
  }
  int port = 0;
  if (testsrv_new(a.cq, argv[1], 0, &a.stats, &port, &a.srv, &err) != MEGA_OK) {
    fprintf(stderr, "rpc_test_server: %s\n", err.msg);
    return 1;
  }
  uv_signal_init(&a.loop, &a.sigterm);
  uv_signal_init(&a.loop, &a.sigint);
  a.sigterm.data = a.sigint.data = &a;
  uv_signal_start(&a.sigterm, on_signal, SIGTERM);
  uv_signal_start(&a.sigint, on_signal, SIGINT);
  printf("PORT %d\n", port);
  fflush(stdout);
  uv_run(&a.loop, UV_RUN_DEFAULT);
  uv_loop_close(&a.loop);
  return mega_rpc_wait_released(5000) ? 0 : 1;
}
