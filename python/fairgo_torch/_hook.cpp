// fairgo's DDP comm hook in C++: the same algorithm as allreduce_hook in
// __init__.py, run by DDP's reducer on the backward's thread without the
// Python interpreter (no GIL, no Python call per bucket).
//
// Built on first use by torch.utils.cpp_extension (fairgo_torch.register_hook);
// it takes libfairgo's functions as addresses from the package's ctypes
// library, so it links against nothing of fairgo's.
//
// What holds: every bucket's reduction is ordered after the work on the
// current stream when the bucket is handed over, and runs on fairgo's
// streams (fairgo_allreduce_async); the last bucket of the backward pass
// makes the current stream wait for its reduction (fairgo_allreduce) and for
// every earlier one (fairgo_work_stream_wait), then completes their futures
// as of that stream. A work is freed once it has completed; its error is
// raised from a later bucket, within kReapAt of them.

#include <torch/extension.h>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using AllReduceFn = int (*)(int64_t comm, void* data, int64_t count, int dtype, int op, void* stream, int64_t* work);
using StreamWaitFn = int (*)(int64_t work, void* stream);
using TestFn = int (*)(int64_t work, int* done);
using FreeFn = int (*)(int64_t work);
using LastErrorFn = const char* (*)();

// The library's functions, by address (ctypes gives them), and the numbers
// of fairgo.h the hook passes.
struct Library {
  AllReduceFn allreduce;
  AllReduceFn allreduce_async;
  StreamWaitFn stream_wait;
  TestFn test;
  FreeFn free;
  LastErrorFn last_error;
  int avg;
  int float16, bfloat16, float32, float64;
};

constexpr size_t kReapAt = 8;  // as _REAP_AT in _comm.py

class FairgoHook : public c10d::CommHookInterface {
 public:
  FairgoHook(Library lib, int64_t comm) : lib_(lib), comm_(comm) {}

  ~FairgoHook() override {
    std::lock_guard<std::mutex> g(mu_);
    for (auto& p : earlier_) lib_.free(p.work);  // their work goes on; their futures stay pending
    for (int64_t w : tracked_) lib_.free(w);
  }

  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    at::Tensor& buf = bucket.getBufferRef();
    TORCH_CHECK(buf.is_cuda() && buf.is_contiguous(), "fairgo: the bucket is not a contiguous CUDA tensor");
    const int dtype = dtypeOf(buf.scalar_type());
    const auto device = buf.device();
    void* stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
    auto fut = c10::make_intrusive<c10::ivalue::Future>(c10::TensorType::get(), std::vector<c10::Device>{device});
    std::lock_guard<std::mutex> g(mu_);
    reap();
    int64_t work = 0;
    if (!bucket.isLast()) {
      check(lib_.allreduce_async(comm_, buf.data_ptr(), buf.numel(), dtype, lib_.avg, stream, &work));
      earlier_.push_back(Pending{work, fut, buf});
      return fut;
    }
    std::vector<Pending> earlier;
    earlier.swap(earlier_);
    const int code = lib_.allreduce(comm_, buf.data_ptr(), buf.numel(), dtype, lib_.avg, stream, &work);
    std::string failed = complete(earlier, stream);  // every earlier future done, whatever this call did
    check(code);
    tracked_.push_back(work);
    TORCH_CHECK(failed.empty(), failed);
    fut->markCompleted(c10::IValue(buf));
    return fut;
  }

  at::Tensor parseHookResult(const c10::IValue& result) override { return result.toTensor(); }

 private:
  struct Pending {
    int64_t work;
    c10::intrusive_ptr<c10::ivalue::Future> fut;
    at::Tensor buf;
  };

  int dtypeOf(at::ScalarType t) const {
    switch (t) {
      case at::kHalf: return lib_.float16;
      case at::kBFloat16: return lib_.bfloat16;
      case at::kFloat: return lib_.float32;
      case at::kDouble: return lib_.float64;
      default: break;
    }
    TORCH_CHECK(false, "fairgo: a gradient bucket of ", t, ": the C++ hook takes float16, bfloat16, float32 and float64");
    return -1;
  }

  void check(int code) const {
    TORCH_CHECK(code == 0, "fairgo: ", lib_.last_error());
  }

  // Makes stream wait for each earlier bucket's reduction and completes its
  // future as of stream; a work that cannot be waited on fails its future.
  // Returns the first failure's text ("" when none).
  std::string complete(std::vector<Pending>& earlier, void* stream) {
    std::string failed;
    for (auto& p : earlier) {
      if (lib_.stream_wait(p.work, stream) != 0) {
        std::string what = std::string("fairgo: ") + lib_.last_error();
        lib_.free(p.work);
        p.fut->setError(std::make_exception_ptr(std::runtime_error(what)));
        if (failed.empty()) failed = what;
        continue;
      }
      tracked_.push_back(p.work);
      p.fut->markCompleted(c10::IValue(p.buf));
    }
    return failed;
  }

  // Frees the completed works at the front once kReapAt are kept; raises
  // the first failure.
  void reap() {
    if (tracked_.size() < kReapAt) return;
    while (!tracked_.empty()) {
      int done = 0;
      const int code = lib_.test(tracked_.front(), &done);
      if (code == 0 && !done) return;
      const int64_t w = tracked_.front();
      tracked_.pop_front();
      std::string what = code != 0 ? std::string("fairgo: ") + lib_.last_error() : std::string();
      lib_.free(w);
      TORCH_CHECK(what.empty(), what);
    }
  }

  const Library lib_;
  const int64_t comm_;
  std::mutex mu_;
  std::vector<Pending> earlier_;  // this backward pass's buckets before the last
  std::deque<int64_t> tracked_;   // works whose outcome is not yet observed
};

template <typename Fn>
Fn fn(int64_t address) {
  TORCH_CHECK(address != 0, "fairgo: a library function's address is 0");
  return reinterpret_cast<Fn>(static_cast<uintptr_t>(address));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "fairgo's DDP comm hook in C++ (fairgo_torch.register_hook builds and uses it)";
  m.def(
      "register",
      [](const std::shared_ptr<c10d::Reducer>& reducer, int64_t comm, const std::vector<int64_t>& functions,
         const std::vector<int>& numbers) {
        TORCH_CHECK(functions.size() == 6 && numbers.size() == 5, "fairgo: register: 6 functions and 5 numbers");
        Library lib{fn<AllReduceFn>(functions[0]), fn<AllReduceFn>(functions[1]), fn<StreamWaitFn>(functions[2]),
                    fn<TestFn>(functions[3]),      fn<FreeFn>(functions[4]),      fn<LastErrorFn>(functions[5]),
                    numbers[0],                    numbers[1],                    numbers[2],
                    numbers[3],                    numbers[4]};
        reducer->register_comm_hook(std::make_unique<FairgoHook>(lib, comm));
      },
      "Registers fairgo's comm hook on a DDP reducer (ddp.reducer) for the communicator comm.");
}
