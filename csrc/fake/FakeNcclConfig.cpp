#include "fake/FakeNcclConfig.hpp"

#include <c10/util/StringUtil.h>

#include <cstdlib>
#include <vector>

namespace streamnccl::fake {

int ncclEnvInt(const char* name) {
  const char* raw = std::getenv(name);
  if (raw == nullptr || *raw == '\0') {
    return NCCL_CONFIG_UNDEF_INT;
  }
  char* end = nullptr;
  const long value = std::strtol(raw, &end, 0);
  return end == raw ? NCCL_CONFIG_UNDEF_INT : static_cast<int>(value);
}

bool blocksWith(const ncclConfig_t* config) {
  if (const int env = ncclEnvInt("NCCL_COMM_BLOCKING"); env == 0 || env == 1) {
    return env == 1;
  }
  return config == nullptr || config->blocking != 0;
}

bool splitsShareWith(const ncclConfig_t* config) {
  if (const int env = ncclEnvInt("NCCL_COMM_SPLIT_SHARE_RESOURCES"); env != NCCL_CONFIG_UNDEF_INT) {
    return env != 0;
  }
  return config != nullptr && config->splitShare != NCCL_CONFIG_UNDEF_INT &&
         config->splitShare != 0;
}

bool shrinksShareWith(const ncclConfig_t* config) {
  if (const int env = ncclEnvInt("NCCL_COMM_SHRINK_SHARE_RESOURCES");
      env != NCCL_CONFIG_UNDEF_INT) {
    return env != 0;
  }
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
  return config != nullptr && config->shrinkShare != NCCL_CONFIG_UNDEF_INT &&
         config->shrinkShare != 0;
#else
  return false;
#endif
}

std::string configText(const ncclConfig_t* config) {
  if (config == nullptr) {
    return "";
  }
  std::vector<std::string> set;
  const auto number = [&](const char* name, int value) {
    if (value != NCCL_CONFIG_UNDEF_INT) {
      set.push_back(std::string(name) + "=" + std::to_string(value));
    }
  };
  number("cgaClusterSize", config->cgaClusterSize);
  number("minCTAs", config->minCTAs);
  number("maxCTAs", config->maxCTAs);
  if (config->netName != NCCL_CONFIG_UNDEF_PTR) {
    set.push_back(std::string("netName=") + config->netName);
  }
  number("splitShare", config->splitShare);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
  if (config->commName != NCCL_CONFIG_UNDEF_PTR) {
    set.push_back(std::string("commName=") + config->commName);
  }
#endif
  return set.empty() ? "" : ", config{" + c10::Join(", ", set) + "}";
}

std::string configRefusal(const ncclConfig_t* config) {
  if (config == nullptr) {
    return "";
  }
  if (config->magic != 0xcafebeef) {
    return "ncclConfig_t not made with NCCL_CONFIG_INITIALIZER";
  }
  const auto set = [](int value) { return value != NCCL_CONFIG_UNDEF_INT; };
  if (set(config->blocking) && config->blocking != 0 && config->blocking != 1) {
    return "blocking " + std::to_string(config->blocking);
  }
  if (set(config->cgaClusterSize) && config->cgaClusterSize < 0) {
    return "cgaClusterSize " + std::to_string(config->cgaClusterSize);
  }
  if ((set(config->minCTAs) && config->minCTAs <= 0) ||
      (set(config->maxCTAs) && config->maxCTAs <= 0) ||
      config->minCTAs > config->maxCTAs) {  // before defaults: an unset max is INT_MIN
    return "minCTAs/maxCTAs " + std::to_string(config->minCTAs) + "/" +
           std::to_string(config->maxCTAs);
  }
  if (set(config->splitShare) && config->splitShare != 0 && config->splitShare != 1) {
    return "splitShare " + std::to_string(config->splitShare);
  }
  return "";
}

}  // namespace streamnccl::fake
