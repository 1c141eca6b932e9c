/*
 * handoff's one native piece: scatter receive for the tcp NIC (src/transfer/tcp/scatter_native.ts).
 *
 * Node reads a socket into one buffer per read; a READ reply whose destination pages are scattered in
 * our slab would take one read per page, or a copy out of a staging buffer. readv(2) lets the kernel
 * copy one run of the stream into many pages in one call, as an RDMA NIC's scatter list does.
 *
 *   scatterRead(fd, slabs, segs, count) -> bytes read (>= 0)
 *     fd     the socket's descriptor (non-blocking, owned by libuv; we only read from it)
 *     slabs  Uint8Array[] (views of the engine's SharedArrayBuffer slabs)
 *     segs   Float64Array of count triples (slab, offset, length), each inside its slab
 *     0 means nothing could be read now (EAGAIN), or end of stream / an error: libuv's own next read
 *     sees those and closes the connection as usual.
 *
 * Arguments are checked (a bad one throws a TypeError/RangeError in JS): a segment outside its slab
 * never reaches the kernel.
 */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <sys/uio.h>
#include <node_api.h>

#define SEGS_MAX 1024

static napi_value throw_range(napi_env env, const char *msg) {
  napi_throw_range_error(env, NULL, msg);
  return NULL;
}

static napi_value scatter_read(napi_env env, napi_callback_info info) {
  size_t argc = 4;
  napi_value argv[4];
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok || argc != 4) {
    napi_throw_type_error(env, NULL, "scatterRead(fd, slabs, segs, count)");
    return NULL;
  }
  int32_t fd = -1, count = 0;
  if (napi_get_value_int32(env, argv[0], &fd) != napi_ok || fd < 0) return throw_range(env, "bad fd");
  if (napi_get_value_int32(env, argv[3], &count) != napi_ok || count < 1 || count > SEGS_MAX)
    return throw_range(env, "count must be 1..1024");
  bool is_array = false;
  uint32_t nslabs = 0;
  if (napi_is_array(env, argv[1], &is_array) != napi_ok || !is_array ||
      napi_get_array_length(env, argv[1], &nslabs) != napi_ok)
    return throw_range(env, "slabs must be an array");
  napi_typedarray_type type;
  size_t nsegs = 0;
  void *segdata = NULL;
  if (napi_get_typedarray_info(env, argv[2], &type, &nsegs, &segdata, NULL, NULL) != napi_ok ||
      type != napi_float64_array || nsegs < (size_t)count * 3)
    return throw_range(env, "segs must be a Float64Array of count triples");
  const double *segs = (const double *)segdata;

  struct iovec iov[SEGS_MAX];
  for (int32_t i = 0; i < count; i++) {
    double slab = segs[3 * i], offset = segs[3 * i + 1], length = segs[3 * i + 2];
    if (!(slab >= 0 && slab < nslabs && slab == (double)(uint32_t)slab)) return throw_range(env, "bad slab");
    napi_value view;
    if (napi_get_element(env, argv[1], (uint32_t)slab, &view) != napi_ok) return throw_range(env, "bad slab");
    napi_typedarray_type vt;
    size_t vlen = 0;
    void *vdata = NULL;
    if (napi_get_typedarray_info(env, view, &vt, &vlen, &vdata, NULL, NULL) != napi_ok || vt != napi_uint8_array)
      return throw_range(env, "slabs must be Uint8Arrays");
    if (!(offset >= 0 && length > 0 && offset == (double)(size_t)offset && length == (double)(size_t)length &&
          offset + length <= (double)vlen))
      return throw_range(env, "segment outside its slab");
    iov[i].iov_base = (uint8_t *)vdata + (size_t)offset;
    iov[i].iov_len = (size_t)length;
  }
  ssize_t n;
  do {
    n = readv(fd, iov, count);
  } while (n < 0 && errno == EINTR);
  napi_value out;
  napi_create_double(env, n > 0 ? (double)n : 0, &out);
  return out;
}

static napi_value init(napi_env env, napi_value exports) {
  napi_value fn;
  napi_create_function(env, "scatterRead", NAPI_AUTO_LENGTH, scatter_read, NULL, &fn);
  napi_set_named_property(env, exports, "scatterRead", fn);
  return exports;
}

NAPI_MODULE(NODE_GYP_MODULE_NAME, init)
