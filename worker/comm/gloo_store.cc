// Rendezvous stores: Gloo's FileStore, or the caller's mega_kv_ops vtable,
// both seen by Gloo through GroupStore.
#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <new>

#include "worker/comm/gloo_internal.hh"

namespace mega_gloo {

namespace {

int clamp_ms(ms t) {
  long long v = t.count();
  if (v <= 0) return 1;
  return v > 0x7fffffff ? 0x7fffffff : static_cast<int>(v);
}

[[noreturn]] void throw_kv(const char *op, const std::string &key,
                           mega_status st, const mega_err &e) {
  throw StoreError(st, std::string("store ") + op + " of key '" + key +
                           "': " + (e.msg[0] ? e.msg : mega_status_str(st)));
}

}  // namespace

GroupStore::GroupStore(mega_store &base, const std::string &group, ms timeout)
    : base_(base), prefix_(base.prefix + "/" + group + "/"),
      timeout_(timeout), here_(base.here.count(group) > 0) {}

void GroupStore::set(const std::string &key, const std::vector<char> &data) {
  std::string k = prefix_ + key;
  if (base_.file) {
    std::lock_guard<std::mutex> lock(base_.file_mu);
    base_.file->set(k, data);
    return;
  }
  mega_err e = {};
  mega_status st = base_.ops->set(base_.ctx, k.c_str(), data.data(),
                                  data.size(), &e);
  if (st != MEGA_OK) throw_kv("set", k, st, e);
}

std::vector<char> GroupStore::get(const std::string &key) {
  std::string k = prefix_ + key;
  if (base_.file) {
    // FileStore::get waits 30 s by itself; bound the wait by ours first.
    base_.file->wait({k}, timeout_);
    return base_.file->get(k);
  }
  mega_err e = {};
  void *v = nullptr;
  size_t len = 0;
  mega_status st =
      base_.ops->get(base_.ctx, k.c_str(), &v, &len, clamp_ms(timeout_), &e);
  if (st != MEGA_OK) throw_kv("get", k, st, e);
  std::vector<char> out;
  try {
    out.assign(static_cast<char *>(v), static_cast<char *>(v) + len);
  } catch (...) {
    free(v);
    throw;
  }
  free(v);
  return out;
}

void GroupStore::wait(const std::vector<std::string> &keys) {
  wait(keys, timeout_);
}

void GroupStore::wait(const std::vector<std::string> &keys, const ms &timeout) {
  std::vector<std::string> ks;
  for (const auto &k : keys) ks.push_back(prefix_ + k);
  if (base_.file) {
    base_.file->wait(ks, timeout);
    return;
  }
  std::vector<const char *> ptrs;
  for (const auto &k : ks) ptrs.push_back(k.c_str());
  mega_err e = {};
  mega_status st = base_.ops->wait(base_.ctx, ptrs.data(), ptrs.size(),
                                   clamp_ms(timeout), &e);
  if (st != MEGA_OK) throw_kv("wait", ks.empty() ? "" : ks[0], st, e);
}

namespace {

std::vector<char> slice_of(const std::vector<char> &v, uint32_t parts, uint32_t part,
                           const std::string &key) {
  if (!parts) return v;
  if (part >= parts || v.size() % parts)
    throw StoreError(MEGA_ERR_INVALID,
                     "store gather of key '" + key + "': a value of " +
                         std::to_string(v.size()) + " bytes is not " + std::to_string(parts) +
                         " equal parts (the ranks disagree on the group's size?)");
  size_t n = v.size() / parts;
  return std::vector<char>(v.begin() + part * n, v.begin() + (part + 1) * n);
}

}  // namespace

std::vector<std::vector<char>> GroupStore::exchange(const std::string &key,
                                                    const std::vector<char> &value,
                                                    const std::vector<std::string> &keys,
                                                    uint32_t parts,
                                                    const std::vector<uint32_t> &part) {
  std::vector<std::vector<char>> out;
  if (base_.file || !base_.ops->gather) {
    set(key, value);
    for (size_t i = 0; i < keys.size(); i++)
      out.push_back(slice_of(get(keys[i]), parts, parts ? part[i] : 0, prefix_ + keys[i]));
    return out;
  }
  std::vector<const char *> ptrs;
  for (const auto &k : keys) ptrs.push_back(k.c_str());
  std::vector<size_t> lens(keys.size());
  mega_kv_gather g = {};
  g.prefix = prefix_.c_str();
  g.set_key = key.c_str();
  g.set_value = value.data();
  g.set_len = value.size();
  g.keys = ptrs.data();
  g.nkeys = ptrs.size();
  g.parts = parts;
  g.part = parts ? part.data() : nullptr;
  g.here = here_;
  void *buf = nullptr;
  mega_err e = {};
  mega_status st = base_.ops->gather(base_.ctx, &g, clamp_ms(timeout_), &buf, lens.data(), &e);
  if (st != MEGA_OK) throw_kv("gather", keys.empty() ? prefix_ + key : prefix_ + keys[0], st, e);
  try {
    const char *at = static_cast<const char *>(buf);
    for (size_t n : lens) {
      out.emplace_back(at, at + n);
      at += n;
    }
  } catch (...) {
    free(buf);
    throw;
  }
  free(buf);
  return out;
}

}  // namespace mega_gloo

extern "C" {

static mega_status check_prefix(const char *prefix, mega_err *err) {
  if (!prefix || !prefix[0])
    return mega_fail(err, MEGA_ERR_INVALID,
                     "store prefix is empty: pass the job and attempt, e.g. "
                     "\"job7/a0\", so keys of different runs never meet");
  return MEGA_OK;
}

mega_status mega_store_open_file(const char *dir, const char *prefix,
                                 mega_store **out, mega_err *err) {
  if (!out) return mega_fail(err, MEGA_ERR_INVALID, "mega_store_open_file: out is NULL");
  *out = nullptr;
  if (!dir || !dir[0])
    return mega_fail(err, MEGA_ERR_INVALID, "store directory is empty");
  mega_status st = check_prefix(prefix, err);
  if (st != MEGA_OK) return st;
  struct stat sb;
  if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
    return mega_fail(err, MEGA_ERR_NOT_FOUND,
                     "store directory '%s' does not exist or is not a "
                     "directory: create it, on a file system every rank sees",
                     dir);
  try {
    auto s = std::make_unique<mega_store>();
    s->prefix = prefix;
    s->file = std::make_unique<gloo::rendezvous::FileStore>(dir);
    *out = s.release();
    return MEGA_OK;
  } catch (const std::bad_alloc &) {
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory opening a file store");
  } catch (const std::exception &e) {
    return mega_fail(err, MEGA_ERR_IO, "cannot open file store at '%s': %s",
                     dir, mega_gloo::clean_what(e.what()).c_str());
  } catch (...) {
    return mega_fail(err, MEGA_ERR_INTERNAL, "cannot open file store at '%s'", dir);
  }
}

mega_status mega_store_open_kv(const mega_kv_ops *ops, void *ctx,
                               const char *prefix, mega_store **out,
                               mega_err *err) {
  if (!out) return mega_fail(err, MEGA_ERR_INVALID, "mega_store_open_kv: out is NULL");
  *out = nullptr;
  if (!ops || !ops->set || !ops->get || !ops->wait)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "key-value store ops are incomplete: set, get and wait "
                     "are all required");
  mega_status st = check_prefix(prefix, err);
  if (st != MEGA_OK) return st;
  try {
    auto s = std::make_unique<mega_store>();
    s->prefix = prefix;
    s->ops = ops;
    s->ctx = ctx;
    *out = s.release();
    return MEGA_OK;
  } catch (...) {
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory opening a store");
  }
}

mega_status mega_store_group_here(mega_store *store, const char *group, mega_err *err) {
  if (!store || !group || !group[0])
    return mega_fail(err, MEGA_ERR_INVALID, "mega_store_group_here: no store or group");
  try {
    store->here.insert(group);
    return MEGA_OK;
  } catch (...) {
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  }
}

void mega_store_close(mega_store *store) { delete store; }

mega_status mega_store_set(mega_store *store, const char *group, const char *key,
                           const void *value, size_t len, mega_err *err) {
  if (!store || !group || !key || (!value && len))
    return mega_fail(err, MEGA_ERR_INVALID, "mega_store_set: a NULL argument");
  try {
    mega_gloo::GroupStore gs(*store, group, mega_gloo::ms(1000));
    const char *p = static_cast<const char *>(value);
    gs.set(key, std::vector<char>(p, p + len));
    return MEGA_OK;
  } catch (const mega_gloo::StoreError &e) {
    return mega_fail(err, e.status, "%s", e.what());
  } catch (const std::exception &e) {
    return mega_fail(err, MEGA_ERR_IO, "store set of '%s/%s': %s", group, key, e.what());
  }
}

mega_status mega_store_get(mega_store *store, const char *group, const char *key,
                           void **value, size_t *len, int timeout_ms, mega_err *err) {
  if (!store || !group || !key || !value || !len || timeout_ms <= 0)
    return mega_fail(err, MEGA_ERR_INVALID, "mega_store_get: a NULL argument or no timeout");
  *value = nullptr;
  try {
    mega_gloo::GroupStore gs(*store, group, mega_gloo::ms(timeout_ms));
    std::vector<char> v = gs.get(key);
    *value = malloc(v.size() ? v.size() : 1);
    if (!*value) return mega_fail(err, MEGA_ERR_NOMEM, "mega_store_get: out of memory");
    if (!v.empty()) memcpy(*value, v.data(), v.size());
    *len = v.size();
    return MEGA_OK;
  } catch (const mega_gloo::StoreError &e) {
    return mega_fail(err, e.status, "%s", e.what());
  } catch (const std::exception &e) {
    return mega_fail(err, MEGA_ERR_TIMEOUT, "store get of '%s/%s' within %d ms: %s", group, key,
                     timeout_ms, e.what());
  }
}

}  // extern "C"
