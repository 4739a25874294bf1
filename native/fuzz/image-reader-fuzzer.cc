// libFuzzer harness for the image reader (native/src/image): raw and qcow2 parsing, the
// backing chain, L1/L2 mapping, subclusters, deflate and zstd decompression.
//
// One input is a small directory: the input is split at kSeparator into up to kFiles
// files named "image", "b1", "b2", "b3", so a qcow2 "image" can name "b1" as its backing
// or data file and the fuzzer can explore chains. Each input is opened with format auto,
// mapped with BlockStatus and read in a few places; any outcome is fine except a crash, a
// sanitizer report, a hang, or a broken contract (checked below with __builtin_trap).
//
// Build and run: native/fuzz/fuzz.sh (clang with -fsanitize=fuzzer,address,undefined).
// test/native/image-corpus.test.ts replays the corpus through the real addon in CI.
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "image/image-reader.h"

namespace {

using mooring::Extent;
using mooring::ImageReader;
using mooring::Status;

// Keep in step with test/native/image-corpus.test.ts and native/fuzz/make-seeds.sh.
constexpr char kSeparator[] = "\n--mooring-fuzz-file--\n";
constexpr const char* kFiles[] = {"image", "b1", "b2", "b3"};
constexpr size_t kFileCount = sizeof kFiles / sizeof kFiles[0];
// Bytes one read moves, and extents one BlockStatus returns.
constexpr uint32_t kReadBytes = 64 * 1024;
constexpr uint32_t kExtents = 64;
// Reads per input at the starts of extents.
constexpr size_t kExtentReads = 6;

std::string g_dir;

void RemoveDir() {
  for (const char* f : kFiles) ::unlink((g_dir + "/" + f).c_str());
  ::rmdir(g_dir.c_str());
}

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

void WriteFile(const std::string& path, const uint8_t* p, size_t n) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) abort();
  size_t done = 0;
  while (done < n) {
    ssize_t w = ::write(fd, p + done, n - done);
    if (w <= 0) abort();
    done += static_cast<size_t>(w);
  }
  ::close(fd);
}

// Reads [off, off+len) whole and in two halves: when both succeed they must agree (runs of
// clusters are merged differently for the two).
void ReadTwice(ImageReader* img, uint64_t off, uint32_t len, std::vector<uint8_t>* a, std::vector<uint8_t>* b) {
  if (len == 0) return;
  Status why;
  const int rc = img->Read(off, len, a->data(), &why);
  Check(rc <= 0);
  Check((rc == 0) == why.ok());
  const uint32_t half = len / 2;
  const int rc1 = img->Read(off, half, b->data());
  const int rc2 = img->Read(off + half, len - half, b->data() + half);
  if (rc == 0 && rc1 == 0 && rc2 == 0) Check(std::memcmp(a->data(), b->data(), len) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // tmpfs when there is one: the harness rewrites these files on every input.
  char tmpl[] = "/dev/shm/mooring-image-fuzz-XXXXXX";
  char fallback[] = "/tmp/mooring-image-fuzz-XXXXXX";
  if (::mkdtemp(tmpl) != nullptr) {
    g_dir = tmpl;
  } else if (::mkdtemp(fallback) != nullptr) {
    g_dir = fallback;
  } else {
    abort();
  }
  std::atexit(RemoveDir);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Split the input into the files of this directory; names without a part are removed.
  const size_t sep_len = sizeof kSeparator - 1;
  size_t start = 0;
  for (size_t i = 0; i < kFileCount; ++i) {
    const std::string path = g_dir + "/" + kFiles[i];
    if (start > size) {
      ::unlink(path.c_str());
      continue;
    }
    size_t end = size;
    if (i + 1 < kFileCount) {
      const void* hit = memmem(data + start, size - start, kSeparator, sep_len);
      if (hit != nullptr) end = static_cast<size_t>(static_cast<const uint8_t*>(hit) - data);
    }
    WriteFile(path, data + start, end - start);
    start = end == size ? size + 1 : end + sep_len;
  }

  std::unique_ptr<ImageReader> img;
  Status st = mooring::OpenImage(g_dir + "/image", mooring::ImageFormatRequest::kAuto, &img);
  if (!st.ok()) {
    Check(st.code != mooring::Code::kOk && !st.message.empty());
    return 0;
  }
  const uint64_t vsize = img->size();
  Check(vsize % 512 == 0 && vsize <= mooring::kImageSizeBytesMax);
  std::vector<mooring::ImageLayerInfo> chain;
  img->DescribeChain(&chain);
  Check(!chain.empty() && chain.size() <= mooring::kImageChainDepthMax);
  if (vsize == 0) {
    img->Close();
    return 0;
  }

  std::vector<Extent> ext;
  Status why;
  const int rc = img->BlockStatus(0, vsize, kExtents, &ext, &why);
  std::vector<uint64_t> starts{0};
  if (rc == 0) {
    uint64_t sum = 0;
    Check(!ext.empty() && ext.size() <= kExtents);
    for (size_t i = 0; i < ext.size(); ++i) {
      Check(ext[i].length > 0);
      Check(ext[i].flags == 0 || ext[i].flags == mooring::kExtentZero ||
            ext[i].flags == (mooring::kExtentZero | mooring::kExtentHole));
      if (i > 0) Check(ext[i].flags != ext[i - 1].flags);
      if (starts.size() < kExtentReads && sum > 0) starts.push_back(sum);
      sum += ext[i].length;
    }
    Check(sum <= vsize);
  } else {
    Check(rc < 0 && !why.ok());
  }

  std::vector<uint8_t> a(kReadBytes), b(kReadBytes);
  for (uint64_t off : starts) {
    const uint32_t len = static_cast<uint32_t>(vsize - off < kReadBytes ? vsize - off : kReadBytes);
    ReadTwice(img.get(), off, len, &a, &b);
  }
  // The end of the image, and a place chosen by the input's length.
  const uint32_t tail = static_cast<uint32_t>(vsize < kReadBytes ? vsize : kReadBytes);
  ReadTwice(img.get(), vsize - tail, tail, &a, &b);
  const uint64_t mid = (static_cast<uint64_t>(size) * 2654435761u) % vsize;
  ReadTwice(img.get(), mid, static_cast<uint32_t>(vsize - mid < 4096 ? vsize - mid : 4096), &a, &b);

  img->Close();
  Check(img->Read(0, 1, a.data()) == -ESHUTDOWN);
  return 0;
}
