#include "common/blob_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <strings.h>

namespace fusedattn {

namespace {

constexpr char kMagic[8] = {'F', 'A', 'B', 'L', 'O', 'B', '\r', '\n'};
constexpr const char* kSuffix = ".fab";
constexpr const char* kTempPrefix = ".tmp.";
constexpr time_t kStaleTempSeconds = 3600;
constexpr uint64_t kChecksumSeed = 0x6661626c6f623031ull;  // "fablob01"
constexpr uint64_t kHeaderSeed = 0x6865616465723031ull;    // "header01"

uint64_t Mix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

std::string Hex(uint64_t v) {
  static const char digits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<size_t>(i)] = digits[v & 15];
  return s;
}

std::string Errno(const char* what, const std::string& path) {
  return Format("%s %s: %s", what, path.c_str(), std::strerror(errno));
}

// Reads exactly bytes at offset; false on a short read (a truncated file).
bool ReadAt(int fd, void* out, size_t bytes, off_t offset) {
  char* p = static_cast<char*>(out);
  while (bytes > 0) {
    ssize_t n = pread(fd, p, bytes, offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n, bytes -= static_cast<size_t>(n), offset += n;
  }
  return true;
}

bool WriteAll(int fd, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n, bytes -= static_cast<size_t>(n);
  }
  return true;
}

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t key_bytes;
  uint64_t payload_bytes;
  uint64_t checksum;      // over key and payload, seeded with the lengths
  uint64_t header_check;  // over the 32 bytes above
};
static_assert(sizeof(Header) == BlobCache::kHeaderBytes, "header layout");

uint64_t Checksum(const std::string& key, const void* payload, uint64_t payload_bytes) {
  uint64_t seed = kChecksumSeed ^ Mix(key.size() * 0x9e3779b97f4a7c15ull + payload_bytes);
  return HashBytes(payload, payload_bytes, HashBytes(key.data(), key.size(), seed));
}

uint64_t HeaderCheck(const Header& h) { return HashBytes(&h, 32, kHeaderSeed); }

// mkdir -p with mode 0700 for the directories it creates.
bool MakeDirectories(const std::string& path, std::string* error) {
  if (path.empty()) {
    *error = "the cache directory is an empty path";
    return false;
  }
  for (size_t at = 1; at <= path.size(); ++at) {
    if (at != path.size() && path[at] != '/') continue;
    std::string prefix = path.substr(0, at);
    if (mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) {
      *error = Errno("cannot create", prefix);
      return false;
    }
  }
  return true;
}

bool Disabling(const char* value) {
  if (*value == '\0') return true;
  for (const char* word : {"0", "off", "false", "no"})
    if (strcasecmp(value, word) == 0) return true;
  return false;
}

}  // namespace

uint64_t HashBytes(const void* data, size_t bytes, uint64_t seed) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint64_t h = Mix(seed ^ (bytes * 0x9e3779b97f4a7c15ull));
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ Mix(w)) * 0x9e3779b97f4a7c15ull;
    h = (h << 27) | (h >> 37);
  }
  uint64_t tail = 0;
  for (size_t k = 0; i + k < bytes; ++k) tail |= uint64_t{p[i + k]} << (8 * k);
  h = (h ^ Mix(tail ^ 0xa5a5a5a5a5a5a5a5ull)) * 0x9e3779b97f4a7c15ull;
  return Mix(h);
}

CacheLocation CacheLocationFromEnvironment() {
  CacheLocation loc;
  loc.max_bytes = BlobCache::kDefaultMaxBytes;
  if (const char* mb = std::getenv("FUSEDATTN_CACHE_MAX_MB"); mb != nullptr && *mb != '\0') {
    char* end = nullptr;
    long long n = std::strtoll(mb, &end, 10);
    if (end == mb || *end != '\0' || n < 1 || n > (1ll << 40)) {
      loc.reason = Format("FUSEDATTN_CACHE_MAX_MB = '%s' is not a positive number of MiB, so the "
                          "on-disk cache is off",
                          mb);
      return loc;
    }
    loc.max_bytes = static_cast<uint64_t>(n) << 20;
  }
  if (const char* dir = std::getenv("FUSEDATTN_CACHE_DIR"); dir != nullptr) {
    if (Disabling(dir)) {
      loc.reason = Format("FUSEDATTN_CACHE_DIR = '%s' turns the on-disk cache off", dir);
      return loc;
    }
    loc.enabled = true;
    loc.directory = dir;
    return loc;
  }
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && xdg[0] == '/') {
    loc.enabled = true;
    loc.directory = std::string(xdg) + "/fusedattn";
    return loc;
  }
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] == '/') {
    loc.enabled = true;
    loc.directory = std::string(home) + "/.cache/fusedattn";
    return loc;
  }
  loc.reason = "no cache directory: FUSEDATTN_CACHE_DIR is unset and neither XDG_CACHE_HOME nor "
               "HOME is an absolute path";
  return loc;
}

BlobCache::BlobCache(std::string directory, uint64_t max_bytes)
    : directory_(std::move(directory)), max_bytes_(max_bytes) {
  while (directory_.size() > 1 && directory_.back() == '/') directory_.pop_back();
  std::string error;
  if (!MakeDirectories(directory_, &error)) {
    status_ = NotSupported("on-disk cache off: %s", error.c_str());
    return;
  }
  struct stat st;
  if (stat(directory_.c_str(), &st) != 0) {
    status_ = NotSupported("on-disk cache off: %s", Errno("cannot stat", directory_).c_str());
    return;
  }
  if (!S_ISDIR(st.st_mode)) {
    status_ = NotSupported("on-disk cache off: %s is not a directory", directory_.c_str());
    return;
  }
  // Entries hold compiled kernels that get loaded: a directory others can write to could hand
  // this process someone else's code.
  if (st.st_uid != geteuid() || (st.st_mode & 022) != 0) {
    status_ = NotSupported(
        "on-disk cache off: %s belongs to another user or is writable by group or others (mode "
        "%03o); its entries hold compiled kernels, so it must be the user's own (chmod go-w)",
        directory_.c_str(), static_cast<unsigned>(st.st_mode & 0777));
    return;
  }
  if (access(directory_.c_str(), W_OK | X_OK) != 0) {
    status_ = NotSupported("on-disk cache off: %s", Errno("cannot write to", directory_).c_str());
    return;
  }
}

BlobCache BlobCache::Disabled(std::string reason) {
  BlobCache cache;
  cache.status_ = NotSupported("%s", reason.c_str());
  return cache;
}

BlobCache::BlobCache(BlobCache&& other) noexcept
    : status_(std::move(other.status_)),
      directory_(std::move(other.directory_)),
      max_bytes_(other.max_bytes_) {}

std::string BlobCache::path_of(const std::string& key) const {
  return directory_ + "/" + Hex(HashBytes(key.data(), key.size(), 0x6e616d65316c6full)) +
         Hex(HashBytes(key.data(), key.size(), 0x6e616d65326869ull)) + kSuffix;
}

BlobCache::Lookup BlobCache::get(const std::string& key, std::vector<uint8_t>* payload) const {
  payload->clear();
  if (!enabled()) {
    ++misses_;
    return Lookup::kMiss;
  }
  const std::string path = path_of(key);
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    ++misses_;
    return Lookup::kMiss;
  }
  auto result = [&](Lookup lookup) {
    close(fd);
    if (lookup == Lookup::kHit) ++hits_;
    if (lookup == Lookup::kMiss) ++misses_;
    if (lookup == Lookup::kDamaged) {
      ++damaged_;
      payload->clear();
    }
    return lookup;
  };
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return result(Lookup::kDamaged);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  Header h;
  if (size < kHeaderBytes || !ReadAt(fd, &h, kHeaderBytes, 0)) return result(Lookup::kDamaged);
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0 || h.version != kFormatVersion ||
      h.header_check != HeaderCheck(h))
    return result(Lookup::kDamaged);
  if (h.payload_bytes > size || size != kHeaderBytes + h.key_bytes + h.payload_bytes)
    return result(Lookup::kDamaged);  // truncated, or something appended
  std::string stored_key(h.key_bytes, '\0');
  if (!ReadAt(fd, stored_key.data(), h.key_bytes, kHeaderBytes)) return result(Lookup::kDamaged);
  payload->resize(h.payload_bytes);
  if (!ReadAt(fd, payload->data(), h.payload_bytes, static_cast<off_t>(kHeaderBytes + h.key_bytes)))
    return result(Lookup::kDamaged);
  if (h.checksum != Checksum(stored_key, payload->data(), h.payload_bytes))
    return result(Lookup::kDamaged);
  if (stored_key != key) {  // another key with the same name: intact, just not ours
    payload->clear();
    return result(Lookup::kMiss);
  }
  futimens(fd, nullptr);  // most recently used; failure only weakens the eviction order
  return result(Lookup::kHit);
}

Status BlobCache::put(const std::string& key, const void* payload, size_t bytes) const {
  if (!enabled()) return status_;
  const uint64_t total = kHeaderBytes + key.size() + bytes;
  if (total > max_bytes_) {
    ++write_failures_;
    return NotSupported("an entry of %llu bytes exceeds the on-disk cache's bound of %llu bytes "
                        "(FUSEDATTN_CACHE_MAX_MB)",
                        (unsigned long long)total, (unsigned long long)max_bytes_);
  }
  Header h;
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kFormatVersion;
  h.key_bytes = static_cast<uint32_t>(key.size());
  h.payload_bytes = bytes;
  h.checksum = Checksum(key, payload, bytes);
  h.header_check = HeaderCheck(h);

  const std::string path = path_of(key);
  const std::string name = path.substr(directory_.size() + 1);
  const std::string temp = Format("%s/%s%s.%ld.%llu", directory_.c_str(), kTempPrefix,
                                  name.c_str(), static_cast<long>(getpid()),
                                  (unsigned long long)temp_counter_.fetch_add(1));
  int fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    ++write_failures_;
    return Status(FUSEDATTN_ERROR_INTERNAL, Errno("cannot create", temp));
  }
  bool ok = WriteAll(fd, &h, sizeof h) && WriteAll(fd, key.data(), key.size()) &&
            WriteAll(fd, payload, bytes);
  std::string error = ok ? "" : Errno("cannot write", temp);
  if (ok && fsync(fd) != 0) ok = false, error = Errno("cannot fsync", temp);
  if (close(fd) != 0 && ok) ok = false, error = Errno("cannot close", temp);
  if (ok && rename(temp.c_str(), path.c_str()) != 0) ok = false, error = Errno("cannot rename to", path);
  if (!ok) {
    unlink(temp.c_str());
    ++write_failures_;
    return Status(FUSEDATTN_ERROR_INTERNAL, error);
  }
  ++writes_;
  evict(path);
  return Status::Ok();
}

void BlobCache::evict(const std::string& keep) const {
  DIR* dir = opendir(directory_.c_str());
  if (dir == nullptr) return;
  struct Entry {
    std::string path;
    uint64_t bytes;
    struct timespec mtime;
  };
  std::vector<Entry> entries;
  uint64_t total = 0;
  const time_t now = std::time(nullptr);
  const size_t suffix = std::strlen(kSuffix);
  while (struct dirent* d = readdir(dir)) {
    const std::string name = d->d_name;
    const bool entry = name.size() > suffix && name.compare(name.size() - suffix, suffix, kSuffix) == 0 &&
                       name[0] != '.';
    const bool temp = name.rfind(kTempPrefix, 0) == 0;
    if (!entry && !temp) continue;
    const std::string path = directory_ + "/" + name;
    struct stat st;
    if (lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (temp) {
      // A writer that crashed between create and rename; live writers finish within seconds.
      if (now - st.st_mtime > kStaleTempSeconds) unlink(path.c_str());
      continue;
    }
    total += static_cast<uint64_t>(st.st_size);
    if (path != keep) entries.push_back({path, static_cast<uint64_t>(st.st_size), st.st_mtim});
  }
  closedir(dir);
  if (total <= max_bytes_) return;
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    if (a.mtime.tv_sec != b.mtime.tv_sec) return a.mtime.tv_sec < b.mtime.tv_sec;
    if (a.mtime.tv_nsec != b.mtime.tv_nsec) return a.mtime.tv_nsec < b.mtime.tv_nsec;
    return a.path < b.path;
  });
  const uint64_t target = max_bytes_ / 4 * 3;
  for (const Entry& e : entries) {
    if (total <= target) break;
    if (unlink(e.path.c_str()) == 0) ++evictions_;
    total -= e.bytes;  // gone either way: another process may have removed it first
  }
}

BlobCache::Stats BlobCache::stats() const {
  Stats s;
  s.hits = hits_.load(), s.misses = misses_.load(), s.damaged = damaged_.load();
  s.writes = writes_.load(), s.write_failures = write_failures_.load();
  s.evictions = evictions_.load();
  return s;
}

}  // namespace fusedattn
