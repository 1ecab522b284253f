#include "connex/serving/model_name.h"

#include <filesystem>

namespace connex::serving {

std::string ServedModelName(const std::string& model_path) {
  std::filesystem::path p(model_path);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();  // a trailing '/'
  std::string name;
  if (std::filesystem::is_directory(p)) {
    name = p.filename().string();
  } else if (p.filename() == "model.safetensors" && !p.parent_path().filename().empty()) {
    name = p.parent_path().filename().string();
  } else {
    name = p.stem().string();
  }
  for (char& c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) c = '-';
  }
  return name.empty() ? "model" : name;
}

}  // namespace connex::serving
