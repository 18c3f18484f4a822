/* megactl version: this megactl's build and the answering megad's, as
 * kubectl version shows client and server. The two can differ in a rolling
 * upgrade (README "Upgrading"), and then a flag one takes the other may
 * refuse: the output says so. */
#include <stdio.h>
#include <string.h>

#include "client/commands.h"
#include "client/conn.h"
#include "core/version.h"

static int takes_client(const char *cmd, int argc, char **argv, int *i, void *ctx) {
  (void)cmd;
  (void)argc;
  if (strcmp(argv[*i], "--client")) return 0;
  *(bool *)ctx = true;
  (*i)++;
  return 1;
}

/* The answering megad's own entry of its view; NULL when it lists none. */
static const Mega__V1__Node *self_of(const Mega__V1__ListNodesResponse *r) {
  for (size_t i = 0; r->self_node_id && i < r->n_nodes; i++)
    if (r->nodes[i]->id && !strcmp(r->nodes[i]->id, r->self_node_id)) return r->nodes[i];
  return NULL;
}

static int print_json(const char *own, const Mega__V1__Node *self) {
  json_t *j = json_object();
  if (j) json_object_set_new(j, "megactl", json_string(own));
  if (j && self) {
    const char *v = self->version ? self->version : "";
    json_object_set_new(j, "megad", json_pack("{s:s, s:s, s:s}", "version", v, "node",
                                              self->id, "address",
                                              self->address ? self->address : ""));
    json_object_set_new(j, "same_build", json_boolean(!strcmp(v, own)));
  } else if (j) {
    json_object_set_new(j, "megad", json_null());
  }
  return megactl_print_json(j, JSON_INDENT(2));
}

static void print_text(const char *own, const Mega__V1__Node *self) {
  printf("megactl %s\n", own);
  if (!self) return;
  const char *v = self->version ? self->version : "";
  printf("megad   %s (node %s, %s)\n", v[0] ? v : "of a build that does not name its version",
         self->id, self->address && self->address[0] ? self->address : "address not known");
  if (strcmp(v, own))
    printf("megactl and megad are different builds: a flag one takes and the other does not is "
           "refused, and a call one lacks fails (\"does not implement\"); use the megactl of "
           "megad's build, or upgrade megad (README \"Upgrading\")\n");
}

int megactl_version(int argc, char **argv) {
  megactl_common cf;
  bool client = false;
  int rc = megactl_parse_common("version", argc, argv, false, true, &cf, takes_client, &client);
  if (rc) return rc;
  if (cf.help) {
    printf("usage: megactl version [--client] [--json] [--server ADDR]\n\n"
           "Prints this megactl's build of mega and that of the megad it talks to (the node\n"
           "that answered, and its address), and says when the two are different builds\n"
           "(README \"Upgrading\"). --client prints megactl's alone and asks no megad, as\n"
           "megactl --version does. Exits 1 when megad does not answer, after printing\n"
           "megactl's. --json prints {\"megactl\", \"megad\": {\"version\", \"node\",\n"
           "\"address\"} or null, \"same_build\"}.\n");
    return 0;
  }
  const char *own = mega_version();
  if (client) {
    if (cf.json) return print_json(own, NULL);
    printf("megactl %s\n", own);
    return 0;
  }
  Mega__V1__ListNodesRequest req = MEGA__V1__LIST_NODES_REQUEST__INIT;
  ProtobufCMessage *out = NULL;
  mega_err err = {0};
  mega_status st = megactl_unary(cf.server, &mega_control_list_nodes, &req.base,
                                 MEGACTL_TIMEOUT_MS, &out, &err);
  const Mega__V1__Node *self = st == MEGA_OK ? self_of((const void *)out) : NULL;
  rc = cf.json ? print_json(own, self) : (print_text(own, self), 0);
  /* megactl's line lost (a full disk) is said too, not only megad's silence */
  if (st != MEGA_OK && !megactl_output_ok(0)) rc = MEGACTL_EXIT_FAIL;
  if (st != MEGA_OK)
    rc = megactl_fail("megad's version is not known: %s", err.msg);
  else if (!self)
    rc = megactl_fail("megad's version is not known: the megad that answered does not list "
                      "itself among its nodes");
  if (out) protobuf_c_message_free_unpacked(out, NULL);
  return rc;
}
