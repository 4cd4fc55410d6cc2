// Named spdlog loggers, one per subsystem ("server", "session", "batcher").

#ifndef PAGEALLOC_COMMON_LOGGING_H_
#define PAGEALLOC_COMMON_LOGGING_H_

#include <memory>
#include <string>

#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace pagealloc {

// Returns the logger called `name`, creating it (writing to stderr) on first
// use. spdlog's registry makes it the same object everywhere.
inline std::shared_ptr<spdlog::logger> Logger(const std::string& name) {
  std::shared_ptr<spdlog::logger> logger = spdlog::get(name);
  if (logger == nullptr) {
    try {
      logger = spdlog::stderr_color_mt(name);
    } catch (const spdlog::spdlog_ex&) {
      logger = spdlog::get(name);  // another thread made it first
    }
  }
  return logger;
}

}  // namespace pagealloc

#endif  // PAGEALLOC_COMMON_LOGGING_H_
