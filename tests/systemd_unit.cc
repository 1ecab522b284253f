#include "tests/systemd_unit.h"

#include <fstream>
#include <sstream>

#include "connex/base/status.h"
#include "connex/base/strings.h"

namespace connex::testing {
namespace {

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

// Logical lines: a trailing backslash joins the next line (systemd replaces it with a space in
// unit files; in environment files the newline goes).
std::vector<std::string> LogicalLines(const std::string& text, const std::string& joiner) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line, pending;
  bool continued = false;
  while (std::getline(in, line)) {
    if (continued) {
      pending += joiner;
    } else {
      pending.clear();
    }
    // A comment line inside a continuation is skipped, as systemd does.
    std::string t = Trim(line);
    if (continued && (t.rfind('#', 0) == 0 || t.rfind(';', 0) == 0)) continue;
    continued = !line.empty() && line.back() == '\\';
    pending += continued ? line.substr(0, line.size() - 1) : line;
    if (!continued) lines.push_back(pending);
  }
  if (continued) lines.push_back(pending);
  return lines;
}

std::string Unquote(const std::string& v) {
  if (v.size() >= 2 && (v.front() == '"' || v.front() == '\'') && v.back() == v.front()) {
    return v.substr(1, v.size() - 2);
  }
  return v;
}

// %i, %I (the instance) and %% of systemd.unit(5); any other specifier is refused.
absl::StatusOr<std::string> Specifiers(const std::string& what, const std::string& s,
                                       const std::string& instance) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    const char c = i + 1 < s.size() ? s[++i] : '\0';
    if (c == '%') {
      out += '%';
    } else if ((c == 'i' || c == 'I') && !instance.empty()) {
      out += instance;
    } else {
      return absl::InvalidArgumentError(
          StrCat(what, ": specifier %", std::string(1, c), " is not supported by this parser"));
    }
  }
  return out;
}

// Words of a command line: split at blanks, "..." and '...' quoting; $ is refused (systemd
// would expand it, this parser does not).
absl::StatusOr<std::vector<std::string>> Words(const std::string& what, const std::string& s) {
  if (s.find('$') != std::string::npos) {
    return absl::InvalidArgumentError(
        StrCat(what, ": $ in ExecStart (variable expansion) is not supported by this parser"));
  }
  std::vector<std::string> words;
  std::string w;
  bool in_word = false;
  char quote = 0;
  for (char c : s) {
    if (quote != 0) {
      if (c == quote) {
        quote = 0;
      } else {
        w += c;
      }
    } else if (c == '"' || c == '\'') {
      quote = c;
      in_word = true;
    } else if (c == ' ' || c == '\t') {
      if (in_word) words.push_back(w);
      w.clear();
      in_word = false;
    } else {
      w += c;
      in_word = true;
    }
  }
  if (quote != 0) return absl::InvalidArgumentError(StrCat(what, ": unbalanced quote"));
  if (in_word) words.push_back(w);
  return words;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(StrCat(path, ": cannot be read"));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseEnvironmentFile(const std::string& what,
                                                              const std::string& text) {
  std::vector<std::string> env;
  int n = 0;
  for (const std::string& raw : LogicalLines(text, "")) {
    ++n;
    const std::string line = Trim(raw);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    size_t eq = line.find('=');
    if (eq == std::string::npos || eq == 0) {
      return absl::InvalidArgumentError(StrCat(what, ": line ", n, " is not NAME=VALUE: ", line));
    }
    const std::string name = Trim(line.substr(0, eq));
    for (char c : name) {
      if (!(isalnum(static_cast<unsigned char>(c)) || c == '_')) {
        return absl::InvalidArgumentError(StrCat(what, ": line ", n, ": bad name ", name));
      }
    }
    env.push_back(name + "=" + Unquote(Trim(line.substr(eq + 1))));
  }
  return env;
}

absl::StatusOr<SystemdService> ParseServiceUnit(
    const std::string& path, const std::string& instance,
    const std::function<std::string(const std::string&)>& map_path) {
  CONNEX_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  SystemdService service;
  std::string section;
  int exec_starts = 0;
  auto map_env = [&](const std::string& assignment) {
    size_t eq = assignment.find('=');
    return assignment.substr(0, eq + 1) + map_path(assignment.substr(eq + 1));
  };
  for (const std::string& raw : LogicalLines(text, " ")) {
    const std::string line = Trim(raw);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line[0] == '[') {
      section = line;
      continue;
    }
    if (section != "[Service]") continue;
    size_t eq = line.find('=');
    if (eq == std::string::npos) {
      return absl::InvalidArgumentError(StrCat(path, ": not KEY=VALUE: ", line));
    }
    const std::string key = Trim(line.substr(0, eq));
    CONNEX_ASSIGN_OR_RETURN(std::string value,
                            Specifiers(path + " " + key, Trim(line.substr(eq + 1)), instance));
    if (key == "ExecStart") {
      if (++exec_starts > 1) {
        return absl::InvalidArgumentError(StrCat(path, ": more than one ExecStart"));
      }
      if (!value.empty() && std::string("@-:+!").find(value[0]) != std::string::npos) {
        return absl::InvalidArgumentError(
            StrCat(path, ": ExecStart prefix ", value.substr(0, 1), " is not supported"));
      }
      CONNEX_ASSIGN_OR_RETURN(service.exec_start, Words(path + " ExecStart", value));
      for (std::string& w : service.exec_start) w = map_path(w);
    } else if (key == "Environment") {
      CONNEX_ASSIGN_OR_RETURN(std::vector<std::string> words, Words(path + " Environment", value));
      for (const std::string& w : words) service.environment.push_back(map_env(w));
    } else if (key == "EnvironmentFile") {
      const bool optional = !value.empty() && value[0] == '-';
      const std::string file = map_path(optional ? value.substr(1) : value);
      absl::StatusOr<std::string> body = ReadFile(file);
      if (!body.ok()) {
        if (optional) continue;
        return absl::NotFoundError(StrCat(path, ": EnvironmentFile ", value, " (", file,
                                          ") cannot be read: systemd would not start the unit"));
      }
      CONNEX_ASSIGN_OR_RETURN(std::vector<std::string> env, ParseEnvironmentFile(file, *body));
      for (const std::string& e : env) service.environment.push_back(map_env(e));
    }
  }
  if (service.exec_start.empty()) return absl::InvalidArgumentError(path + ": no ExecStart");
  if (service.exec_start[0].empty() || service.exec_start[0][0] != '/') {
    return absl::InvalidArgumentError(StrCat(path, ": ExecStart must name an absolute path"));
  }
  return service;
}

}  // namespace connex::testing
