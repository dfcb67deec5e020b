// The Triton path's autograd node in C++.
//
// At small and mid shapes a forward + backward through a Python autograd.Function costs more host time
// than all of F.rms_norm's forward + backward, whatever its kernels do (docs/performance-notes.md, "The
// host floor"). This extension removes the Python from the call: a torch::autograd::Function whose
// forward and backward launch the kernels that Triton compiled for the Python route, through the CUDA
// driver, from a "recipe" that native.py records once per (device, dtypes, rows, N).
//
// A recipe is the list of launches the Python launchers made for that key: the compiled kernel
// (Triton's CUfunction handle), its grid, warps and shared memory, and each argument, either a tensor
// slot (x, gamma, y / dy, x, gamma, dx, dgamma, scratch...), the call's eps, or a fixed integer. Every
// integer argument of these kernels is a function of the key alone (rows, N, row strides of contiguous
// tensors), and every pointer is 16-byte aligned (checked here), so the compiled specialization stays
// valid for every call with that key.

#include <torch/extension.h>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda.h>
#include <dlfcn.h>

#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <unordered_map>

namespace {

// ----------------------------------------------------------------------------------------------------
// The CUDA driver, opened at run time: no link-time dependency on libcuda.
// ----------------------------------------------------------------------------------------------------

using LaunchKernel = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  unsigned, CUstream, void**, void**);
using FuncGetParamInfo = CUresult (*)(CUfunction, size_t, size_t*, size_t*);
using GetErrorString = CUresult (*)(CUresult, const char**);
using CtxGetCurrent = CUresult (*)(CUcontext*);
using CtxGetDevice = CUresult (*)(CUdevice*);
using CtxSetCurrent = CUresult (*)(CUcontext);
using DeviceGet = CUresult (*)(CUdevice*, int);
using PrimaryCtxRetain = CUresult (*)(CUcontext*, CUdevice);

struct Driver {
  LaunchKernel launch = nullptr;
  FuncGetParamInfo param_info = nullptr;  // CUDA >= 12.4: the compiled kernel's parameter layout
  GetErrorString error_string = nullptr;
  CtxGetCurrent ctx_get_current = nullptr;
  CtxGetDevice ctx_get_device = nullptr;
  CtxSetCurrent ctx_set_current = nullptr;
  DeviceGet device_get = nullptr;
  PrimaryCtxRetain primary_ctx_retain = nullptr;
  bool complete() const {
    return launch && error_string && ctx_get_current && ctx_get_device && ctx_set_current && device_get &&
           primary_ctx_retain;
  }
};

const Driver& driver() {
  static Driver d = [] {
    Driver out;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (lib == nullptr) return out;
    out.launch = reinterpret_cast<LaunchKernel>(dlsym(lib, "cuLaunchKernel"));
    out.param_info = reinterpret_cast<FuncGetParamInfo>(dlsym(lib, "cuFuncGetParamInfo"));
    out.error_string = reinterpret_cast<GetErrorString>(dlsym(lib, "cuGetErrorString"));
    out.ctx_get_current = reinterpret_cast<CtxGetCurrent>(dlsym(lib, "cuCtxGetCurrent"));
    out.ctx_get_device = reinterpret_cast<CtxGetDevice>(dlsym(lib, "cuCtxGetDevice"));
    out.ctx_set_current = reinterpret_cast<CtxSetCurrent>(dlsym(lib, "cuCtxSetCurrent"));
    out.device_get = reinterpret_cast<DeviceGet>(dlsym(lib, "cuDeviceGet"));
    out.primary_ctx_retain = reinterpret_cast<PrimaryCtxRetain>(dlsym(lib, "cuDevicePrimaryCtxRetain"));
    return out;
  }();
  return d;
}

void check(CUresult status, const char* what) {
  if (status == CUDA_SUCCESS) return;
  const char* message = "unknown error";
  driver().error_string(status, &message);
  TORCH_CHECK(false, "rmsnorm (triton, native): ", what, " failed: ", message);
}

// Makes the device's primary context (where Triton loaded the kernels, and where PyTorch works)
// current on this thread. The runtime API does that lazily, so a thread that has only used cached
// memory so far, such as autograd's device thread, may have no current context yet.
void ensure_context(int device) {
  CUdevice wanted = 0;
  check(driver().device_get(&wanted, device), "cuDeviceGet");
  CUcontext current = nullptr;
  check(driver().ctx_get_current(&current), "cuCtxGetCurrent");
  if (current != nullptr) {
    CUdevice on = 0;
    check(driver().ctx_get_device(&on), "cuCtxGetDevice");
    if (on == wanted) return;
  }
  CUcontext primary = nullptr;
  check(driver().primary_ctx_retain(&primary, wanted), "cuDevicePrimaryCtxRetain");
  check(driver().ctx_set_current(primary), "cuCtxSetCurrent");
}

// ----------------------------------------------------------------------------------------------------
// Recipes
// ----------------------------------------------------------------------------------------------------

// How one kernel argument is filled at each call.
enum ArgKind : int64_t { TENSOR = 0, I32 = 1, I64 = 2, EPS = 3 };

struct Arg {
  int64_t kind;
  int64_t value;  // the tensor slot, or the integer
};

// The most parameters one launch passes (its arguments and Triton's trailing scratch pointers), so that
// a launch fills fixed arrays rather than allocating; a kernel with more is not recorded (to_launches)
// and takes the Python route. These kernels pass at most 12 arguments.
constexpr size_t kMaxParams = 32;

struct Launch {
  CUfunction function;
  unsigned grid_x, grid_y, threads, shared;
  std::vector<Arg> args;
  size_t trailing_pointers;  // Triton's scratch pointers after the arguments (null: none is used)
};

struct Scratch {
  std::vector<int64_t> shape;
  at::ScalarType dtype;
};

struct Recipe {
  std::vector<Launch> forward;   // slots: x, gamma, y
  std::vector<Launch> backward;  // slots: dy, x, gamma, dx, dgamma, then the scratch tensors
  std::vector<Scratch> scratch;
};

struct Key {
  int64_t device, x_dtype, gamma_dtype, rows, n;
  bool operator==(const Key& o) const {
    return device == o.device && x_dtype == o.x_dtype && gamma_dtype == o.gamma_dtype && rows == o.rows && n == o.n;
  }
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = std::hash<int64_t>()(k.rows);
    for (int64_t v : {k.device, k.x_dtype, k.gamma_dtype, k.n}) h = h * 1000003u ^ std::hash<int64_t>()(v);
    return h;
  }
};

// The key of x and gamma (x of at least one dimension and N > 0).
Key key_of(const at::Tensor& x, const at::Tensor& gamma) {
  const int64_t n = x.size(-1);
  return Key{x.get_device(), static_cast<int64_t>(x.scalar_type()), static_cast<int64_t>(gamma.scalar_type()),
             x.numel() / n, n};
}

std::mutex recipes_mutex;
// Recipes are never removed, so a pointer to one stays valid after the lock is released.
std::unordered_map<Key, std::unique_ptr<Recipe>, KeyHash> recipes;

std::atomic<int64_t> forward_calls{0};
std::atomic<int64_t> backward_calls{0};

bool aligned(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

// The recipe for x and gamma, or null when there is none or their layout is not the recorded one.
const Recipe* find_recipe(const at::Tensor& x, const at::Tensor& gamma) {
  if (!x.is_cuda() || !x.is_contiguous() || !gamma.is_contiguous() || x.dim() == 0 || !aligned(x) ||
      !aligned(gamma) || gamma.device() != x.device() || x.size(-1) == 0) {
    return nullptr;
  }
  const Key key = key_of(x, gamma);
  std::lock_guard<std::mutex> lock(recipes_mutex);
  auto it = recipes.find(key);
  return it == recipes.end() ? nullptr : it->second.get();
}

void run(const std::vector<Launch>& launches, const std::vector<at::Tensor>& slots, double eps,
         const at::Tensor& on) {
  const c10::cuda::CUDAGuard guard(on.device());
  ensure_context(on.get_device());
  const CUstream stream = at::cuda::getCurrentCUDAStream(on.get_device()).stream();
  const float eps32 = static_cast<float>(eps);
  for (const Launch& l : launches) {
    // One 8-byte cell per argument; the kernel reads the first 4 of an int32 or float32 cell. The
    // trailing cells stay null.
    std::array<uint64_t, kMaxParams> cells{};
    std::array<void*, kMaxParams> params;
    for (size_t i = 0; i < l.args.size(); ++i) {
      const Arg& a = l.args[i];
      switch (a.kind) {
        case TENSOR:
          cells[i] = reinterpret_cast<uint64_t>(slots[a.value].data_ptr());
          break;
        case I32: {
          const int32_t v = static_cast<int32_t>(a.value);
          std::memcpy(&cells[i], &v, sizeof v);
          break;
        }
        case I64:
          std::memcpy(&cells[i], &a.value, sizeof a.value);
          break;
        case EPS:
          std::memcpy(&cells[i], &eps32, sizeof eps32);
          break;
      }
    }
    for (size_t i = 0; i < l.args.size() + l.trailing_pointers; ++i) params[i] = &cells[i];
    check(driver().launch(l.function, l.grid_x, l.grid_y, 1, l.threads, 1, 1, l.shared, stream, params.data(),
                          nullptr),
          "kernel launch");
  }
}

at::Tensor forward_kernels(const Recipe& r, const at::Tensor& x, const at::Tensor& gamma, double eps) {
  at::Tensor y = at::empty_like(x);  // contiguous, as x is
  run(r.forward, {x, gamma, y}, eps, x);
  forward_calls.fetch_add(1, std::memory_order_relaxed);
  return y;
}

// ----------------------------------------------------------------------------------------------------
// The autograd node
// ----------------------------------------------------------------------------------------------------

struct RMSNormNative : public torch::autograd::Function<RMSNormNative> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& gamma,
                            double eps, int64_t recipe) {
    ctx->save_for_backward({x, gamma});
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["recipe"] = recipe;
    return forward_kernels(*reinterpret_cast<const Recipe*>(recipe), x, gamma, eps);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& gamma = saved[1];
    const double eps = ctx->saved_data["eps"].toDouble();
    at::Tensor dy = grads[0];
    if (at::GradMode::is_enabled()) {
      // create_graph=True: through the registered backward op, whose own backward refuses with a
      // message (these kernels' gradients would come back silently detached).
      static const auto op = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("rmsnorm_kernel::rmsnorm_backward", "")
                                 .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                           const at::Tensor&, double)>();
      auto [dx, dgamma] = op.call(dy, x, gamma, eps);
      return {dx, dgamma, at::Tensor(), at::Tensor()};
    }
    // Autograd may hand over any layout of dy (a broadcast gradient of y.sum(), say); the recorded
    // kernels read a contiguous, 16-byte aligned dy.
    if (!dy.is_contiguous()) dy = dy.contiguous();
    if (!aligned(dy)) dy = dy.clone();
    const Recipe& r = *reinterpret_cast<const Recipe*>(ctx->saved_data["recipe"].toInt());
    at::Tensor dx = at::empty_like(x);
    at::Tensor dgamma = at::empty_like(gamma);
    std::vector<at::Tensor> slots{dy, x, gamma, dx, dgamma};
    for (const Scratch& s : r.scratch) slots.push_back(at::empty(s.shape, x.options().dtype(s.dtype)));
    run(r.backward, slots, eps, x);
    backward_calls.fetch_add(1, std::memory_order_relaxed);
    return {dx, dgamma, at::Tensor(), at::Tensor()};
  }
};

// y for x and gamma through the recorded kernels, with the C++ autograd node when a gradient is needed;
// an undefined tensor (None) when no recipe matches x's key and layout.
at::Tensor apply(const at::Tensor& x, const at::Tensor& gamma, double eps) {
  const Recipe* r = find_recipe(x, gamma);
  if (r == nullptr) return at::Tensor();
  if (at::GradMode::is_enabled() && (x.requires_grad() || gamma.requires_grad())) {
    return RMSNormNative::apply(x, gamma, eps, reinterpret_cast<int64_t>(r));
  }
  return forward_kernels(*r, x, gamma, eps);
}

using LaunchSpec = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, std::vector<std::tuple<int64_t, int64_t>>>;

// The compiled kernel's parameters, as the driver reports them, against the recorded arguments: each
// argument's size, then only pointer-sized trailing parameters (Triton's scratch pointers, passed null).
// Returns the number of trailing parameters, or -1 when the layout is not the expected one.
int64_t trailing_parameters(CUfunction f, const std::vector<Arg>& args) {
  if (driver().param_info == nullptr) return -1;
  size_t i = 0;
  for (;; ++i) {
    size_t offset = 0, size = 0;
    if (driver().param_info(f, i, &offset, &size) != CUDA_SUCCESS) break;
    if (i < args.size()) {
      const size_t expected = (args[i].kind == I32 || args[i].kind == EPS) ? 4 : 8;
      if (size != expected) return -1;
    } else if (size != 8) {
      return -1;
    }
  }
  if (i < args.size()) return -1;
  return static_cast<int64_t>(i - args.size());
}

std::vector<Launch> to_launches(const std::vector<LaunchSpec>& specs, bool& ok) {
  std::vector<Launch> out;
  for (const auto& [function, grid_x, grid_y, threads, shared, args] : specs) {
    Launch l;
    l.function = reinterpret_cast<CUfunction>(function);
    l.grid_x = static_cast<unsigned>(grid_x);
    l.grid_y = static_cast<unsigned>(grid_y);
    l.threads = static_cast<unsigned>(threads);
    l.shared = static_cast<unsigned>(shared);
    for (const auto& [kind, value] : args) l.args.push_back(Arg{kind, value});
    const int64_t trailing = trailing_parameters(l.function, l.args);
    if (trailing < 0 || l.args.size() + static_cast<size_t>(trailing) > kMaxParams) ok = false;
    l.trailing_pointers = static_cast<size_t>(std::max<int64_t>(trailing, 0));
    out.push_back(std::move(l));
  }
  return out;
}

// Stores the recipe for x's and gamma's key. False (and nothing stored) when the driver cannot launch
// these kernels this way: no libcuda, no cuFuncGetParamInfo, or a parameter layout other than recorded.
bool add_recipe(const at::Tensor& x, const at::Tensor& gamma, const std::vector<LaunchSpec>& forward,
                const std::vector<LaunchSpec>& backward, const std::vector<at::Tensor>& scratch) {
  if (!driver().complete()) return false;
  bool ok = true;
  auto r = std::make_unique<Recipe>();
  r->forward = to_launches(forward, ok);
  r->backward = to_launches(backward, ok);
  for (const at::Tensor& s : scratch) r->scratch.push_back(Scratch{s.sizes().vec(), s.scalar_type()});
  if (!ok) return false;
  const Key key = key_of(x, gamma);
  std::lock_guard<std::mutex> lock(recipes_mutex);
  recipes.emplace(key, std::move(r));  // a recipe already stored for this key is kept
  return true;
}

std::tuple<int64_t, int64_t> call_counts() { return {forward_calls.load(), backward_calls.load()}; }

void reset_call_counts() {
  forward_calls.store(0);
  backward_calls.store(0);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("apply", &apply, "y = rmsnorm(x) * gamma through the recorded kernels; None without a recipe");
  m.def("add_recipe", &add_recipe, "store the launches recorded for x's and gamma's key");
  m.def("call_counts", &call_counts, "(forward, backward) calls made through this extension");
  m.def("reset_call_counts", &reset_call_counts);
}
