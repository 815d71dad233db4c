#include "xla_ffi/row_writer.h"

#include "xla_ffi/rate_limiter_admission.h"

#include <cfloat>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace py = pybind11;

namespace gear {
namespace {

using Int = __int128;

// The kind of a buffer's single-element format ('b', 'i', 'u' or 'f'), or 0 for anything else (a struct,
// a big-endian number, a float16 is 'f' but sized 2 and never converted).
char FormatKind(const char* format) {
  if (format == nullptr) return 'u';  // plain bytes
  if (*format == '@' || *format == '=' || *format == '<') ++format;
  if (format[0] == '\0' || format[1] != '\0') return 0;
  switch (format[0]) {
    case '?': return 'b';
    case 'b':
    case 'h':
    case 'i':
    case 'l':
    case 'q':
    case 'n': return 'i';
    case 'B':
    case 'H':
    case 'I':
    case 'L':
    case 'Q':
    case 'N': return 'u';
    case 'e':
    case 'f':
    case 'd': return 'f';
    default: return 0;
  }
}

bool IsInteger(char kind) { return kind == 'i' || kind == 'u'; }

Int ReadInteger(const uint8_t* p, char kind, int32_t size) {
  uint64_t bits = 0;
  std::memcpy(&bits, p, static_cast<size_t>(size));  // little-endian host
  if (kind == 'u' || size == 8) return kind == 'u' ? Int(bits) : Int(static_cast<int64_t>(bits));
  const int shift = 64 - 8 * size;  // sign-extend
  return Int(static_cast<int64_t>(bits << shift) >> shift);
}

// Writes `v` as an integer of the field's kind and size when it fits.
bool WriteInteger(uint8_t* p, Int v, char kind, int32_t size) {
  const int bits = 8 * size;
  const Int low = kind == 'u' ? Int(0) : -(Int(1) << (bits - 1));
  const Int high = kind == 'u' ? (Int(1) << bits) - 1 : (Int(1) << (bits - 1)) - 1;
  if (v < low || v > high) return false;
  const uint64_t out = static_cast<uint64_t>(v);
  std::memcpy(p, &out, static_cast<size_t>(size));
  return true;
}

// Writes `d` as a float32 or float64; false when a finite value would overflow, or for other sizes.
bool WriteFloat(uint8_t* p, double d, int32_t size) {
  if (size == 8) {
    std::memcpy(p, &d, sizeof(d));
    return true;
  }
  if (size != 4 || (std::isfinite(d) && std::fabs(d) > FLT_MAX)) return false;
  const float f = static_cast<float>(d);
  std::memcpy(p, &f, sizeof(f));
  return true;
}

double ReadFloat(const uint8_t* p, int32_t size) {
  if (size == 8) {
    double d;
    std::memcpy(&d, p, sizeof(d));
    return d;
  }
  float f;
  std::memcpy(&f, p, sizeof(f));
  return f;
}

}  // namespace

bool SafeCast(char src_kind, int32_t src_size, char dst_kind, int32_t dst_size) {
  if (src_kind == 'b') return dst_kind == 'b' || IsInteger(dst_kind) || dst_kind == 'f';
  if (src_kind == 'f') return dst_kind == 'f' && dst_size >= src_size;
  if (!IsInteger(src_kind)) return false;
  if (dst_kind == 'f') return 2 * src_size <= dst_size;  // int8/16 into float32, int32 into float64
  if (!IsInteger(dst_kind)) return false;
  if (src_kind == dst_kind) return dst_size >= src_size;
  return src_kind == 'u' && dst_size > src_size;  // unsigned into a wider signed integer
}

bool ConvertElements(const uint8_t* src, char src_kind, int32_t src_size, uint8_t* dst, char dst_kind,
                     int32_t dst_size, int64_t count) {
  if (src_kind == 'b' && src_size == 1) {  // bools into any numeric field: 0 or 1
    for (int64_t i = 0; i < count; ++i) {
      const bool b = src[i] != 0;
      uint8_t* out = dst + i * dst_size;
      if (dst_kind == 'b' && dst_size == 1) {
        *out = b ? 1 : 0;
      } else if (IsInteger(dst_kind)) {
        WriteInteger(out, Int(b ? 1 : 0), dst_kind, dst_size);
      } else if (dst_kind != 'f' || !WriteFloat(out, b ? 1.0 : 0.0, dst_size)) {
        return false;
      }
    }
    return true;
  }
  if (IsInteger(src_kind) && dst_kind == 'f') {  // only where the cast is safe: every value is exact
    if (!SafeCast(src_kind, src_size, dst_kind, dst_size)) return false;
    for (int64_t i = 0; i < count; ++i) {
      const Int v = ReadInteger(src + i * src_size, src_kind, src_size);
      if (!WriteFloat(dst + i * dst_size, static_cast<double>(static_cast<int64_t>(v)), dst_size))
        return false;
    }
    return true;
  }
  if (IsInteger(src_kind) && IsInteger(dst_kind)) {
    for (int64_t i = 0; i < count; ++i) {
      if (!WriteInteger(dst + i * dst_size, ReadInteger(src + i * src_size, src_kind, src_size), dst_kind,
                        dst_size)) {
        return false;
      }
    }
    return true;
  }
  if (src_kind == 'f' && dst_kind == 'f' && (src_size == 4 || src_size == 8)) {
    for (int64_t i = 0; i < count; ++i) {
      if (!WriteFloat(dst + i * dst_size, ReadFloat(src + i * src_size, src_size), dst_size)) return false;
    }
    return true;
  }
  return false;
}

namespace {

// A Python bool, int or float (not a subclass) for a scalar field, written into `dst` when it fits.
// Returns 1 written, 0 not this kind of value, -1 this kind but it does not take the short path.
int WritePythonScalar(PyObject* value, const StepFieldType& type, uint8_t* dst) {
  if (PyBool_Check(value)) {  // a bool casts safely into every numeric field (a float32 `done`)
    const uint8_t b = value == Py_True ? 1 : 0;
    return ConvertElements(&b, 'b', 1, dst, type.kind, type.itemsize, 1) ? 1 : -1;
  }
  if (PyFloat_CheckExact(value)) {
    return type.kind == 'f' && WriteFloat(dst, PyFloat_AS_DOUBLE(value), type.itemsize) ? 1 : -1;
  }
  if (PyLong_CheckExact(value)) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow != 0 || (v == -1 && PyErr_Occurred())) {
      PyErr_Clear();
      return -1;
    }
    if (IsInteger(type.kind)) return WriteInteger(dst, Int(v), type.kind, type.itemsize) ? 1 : -1;
    // Into a float field only when exact: |v| <= 2**(mantissa bits + 1).
    const long long exact = type.itemsize == 4 ? (1LL << 24) : (1LL << 53);
    if (type.kind != 'f' || v < -exact || v > exact) return -1;
    return WriteFloat(dst, static_cast<double>(v), type.itemsize) ? 1 : -1;
  }
  return 0;
}

// Copies the elements of a strided buffer `view` into `out` in C order (its bytes as a C-contiguous
// array of the same shape would hold them).
void GatherStrided(const Py_buffer& view, uint8_t* out) {
  const auto* base = static_cast<const uint8_t*>(view.buf);
  std::vector<Py_ssize_t> index(static_cast<size_t>(view.ndim), 0);
  Py_ssize_t total = 1;
  for (int d = 0; d < view.ndim; ++d) total *= view.shape[d];
  for (Py_ssize_t i = 0; i < total; ++i) {
    Py_ssize_t offset = 0;
    for (int d = 0; d < view.ndim; ++d) offset += index[d] * view.strides[d];
    std::memcpy(out + i * view.itemsize, base + offset, static_cast<size_t>(view.itemsize));
    for (int d = view.ndim - 1; d >= 0 && ++index[d] == view.shape[d]; --d) index[d] = 0;
  }
}

}  // namespace

RowWriter::RowWriter(py::object table, std::vector<std::string> names, std::vector<StepFieldType> types)
    : table_object_(std::move(table)), table_(table_object_.cast<OpenTable*>()), types_(std::move(types)) {
  const TableView& view = table_->table().view();
  if (names.size() != types_.size() || static_cast<int32_t>(types_.size()) != view.num_fields) {
    throw std::invalid_argument("RowWriter needs one name and one type per field of the table");
  }
  int64_t offset = 0;
  for (size_t f = 0; f < types_.size(); ++f) {
    names_.push_back(py::str(names[f]));
    int64_t bytes = types_[f].itemsize;
    for (int64_t d : types_[f].shape) bytes *= d;
    if (bytes != view.fields[f].step_bytes) {
      throw std::invalid_argument("field '" + names[f] + "' has " + std::to_string(bytes) +
                                  " bytes per step here, " + std::to_string(view.fields[f].step_bytes) +
                                  " in the table");
    }
    step_bytes_.push_back(bytes);
    staging_offset_.push_back(offset);
    offset += (bytes + 15) / 16 * 16;
  }
  staging_.resize(static_cast<size_t>(offset));
  source_.resize(types_.size());
  strided_.resize(types_.size());
  buffers_.resize(types_.size());
  buffer_held_.assign(types_.size(), false);
}

void RowWriter::CheckStageRoom() {
  const TableView& view = table_->table().view();
  if (staged_steps_ >= view.max_steps) {
    Release();
    throw std::length_error("the episode already has max_steps=" + std::to_string(view.max_steps) +
                            " steps; call end_episode() first");
  }
  if (episode_.size() != types_.size()) episode_.resize(types_.size());
}

void RowWriter::StagePacked() {
  if (!packed_) throw std::logic_error("RowWriter.stage_packed without a packed step");
  CheckStageRoom();
  for (size_t f = 0; f < types_.size(); ++f) {
    episode_[f].insert(episode_[f].end(), source_[f], source_[f] + step_bytes_[f]);
  }
  ++staged_steps_;
  Release();
}

void RowWriter::StageStep(const std::vector<py::buffer>& values) {
  if (values.size() != types_.size()) throw std::invalid_argument("stage_step needs one value per field");
  std::vector<py::buffer_info> infos;
  for (size_t f = 0; f < types_.size(); ++f) {
    infos.push_back(values[f].request());
    const py::buffer_info& info = infos.back();
    const bool contiguous = PyBuffer_IsContiguous(info.view(), 'C') != 0;
    if (!contiguous || info.size * info.itemsize != step_bytes_[f]) {
      throw std::invalid_argument("stage_step: the value of field " + std::to_string(f) +
                                  " is not one C-contiguous step of " + std::to_string(step_bytes_[f]) +
                                  " bytes");
    }
  }
  CheckStageRoom();
  for (size_t f = 0; f < types_.size(); ++f) {
    const auto* data = static_cast<const uint8_t*>(infos[f].ptr);
    episode_[f].insert(episode_[f].end(), data, data + step_bytes_[f]);
  }
  ++staged_steps_;
}

void RowWriter::ReplaceStaged(int32_t field, const py::buffer& values) {
  if (field < 0 || static_cast<size_t>(field) >= types_.size()) {
    throw std::invalid_argument("replace_staged: no field " + std::to_string(field));
  }
  const py::buffer_info info = values.request();
  const int64_t bytes = static_cast<int64_t>(staged_steps_) * step_bytes_[field];
  if (PyBuffer_IsContiguous(info.view(), 'C') == 0 || info.size * info.itemsize != bytes) {
    throw std::invalid_argument("replace_staged: the values of field " + std::to_string(field) +
                                " are not one C-contiguous buffer of " + std::to_string(bytes) + " bytes");
  }
  if (episode_.size() != types_.size()) episode_.resize(types_.size());
  const auto* data = static_cast<const uint8_t*>(info.ptr);
  episode_[field].assign(data, data + bytes);
}

int64_t RowWriter::CommitStaged(float priority, std::optional<double> timeout) {
  if (staged_steps_ < 1) throw std::invalid_argument("end_episode() needs at least one append() first");
  std::vector<const uint8_t*> data(types_.size());
  for (size_t f = 0; f < types_.size(); ++f) data[f] = episode_[f].data();
  int32_t row = -1;
  InsertAdmitted(*table_, data, 1, staged_steps_, nullptr, &priority, &row, timeout, /*admit=*/true);
  DropStaged();
  return row;
}

void RowWriter::DropStaged() {
  for (std::vector<uint8_t>& steps : episode_) steps.clear();
  staged_steps_ = 0;
}

void RowWriter::Release() {
  for (size_t f = 0; f < buffers_.size(); ++f) {
    if (buffer_held_[f]) PyBuffer_Release(&buffers_[f]);
    buffer_held_[f] = false;
  }
  packed_ = false;
}

bool RowWriter::Pack(py::handle step, bool strict, int32_t batch_axis) {
  Release();
  PyObject* dict = step.ptr();
  if (!PyDict_CheckExact(dict) || PyDict_Size(dict) != static_cast<Py_ssize_t>(types_.size())) return false;
  bool with_axis = false, without_axis = false;  // values seen with a batch axis of one, and without
  for (size_t f = 0; f < types_.size(); ++f) {
    const StepFieldType& type = types_[f];
    if (type.kind != 'b' && !IsInteger(type.kind) && type.kind != 'f') return Refuse();
    PyObject* value = PyDict_GetItemWithError(dict, names_[f].ptr());  // borrowed
    if (value == nullptr) {
      PyErr_Clear();
      return Refuse();
    }
    uint8_t* staged = staging_.data() + staging_offset_[f];
    if (type.shape.empty()) {
      const int scalar = WritePythonScalar(value, type, staged);
      if (scalar == 1) {
        source_[f] = staged;
        without_axis = true;
        continue;
      }
      if (scalar == -1) return Refuse();
    }
    if (!PyObject_CheckBuffer(value)) return Refuse();
    Py_buffer& view = buffers_[f];
    if (PyObject_GetBuffer(value, &view, PyBUF_RECORDS_RO) != 0) {
      PyErr_Clear();
      return Refuse();
    }
    buffer_held_[f] = true;
    // One leading axis of size 1 more than a step has: a batch of one, the same bytes as its row.
    const int axis =
        batch_axis != kNone && view.ndim == static_cast<int>(type.shape.size()) + 1 && view.shape[0] == 1 ? 1
                                                                                                          : 0;
    bool same_shape = view.ndim == static_cast<int>(type.shape.size()) + axis;
    for (int d = 0; same_shape && d < static_cast<int>(type.shape.size()); ++d) {
      same_shape = view.shape[d + axis] == type.shape[d];
    }
    const char kind = FormatKind(view.format);
    if (!same_shape || kind == 0) return Refuse();
    (axis == 1 ? with_axis : without_axis) = true;
    const auto* data = static_cast<const uint8_t*>(view.buf);
    if (PyBuffer_IsContiguous(&view, 'C') == 0) {  // a vector environment's transposed state, say
      strided_[f].resize(static_cast<size_t>(step_bytes_[f] / type.itemsize * view.itemsize));
      GatherStrided(view, strided_[f].data());
      data = strided_[f].data();
    }
    if (kind == type.kind && view.itemsize == type.itemsize) {
      source_[f] = data;
      continue;
    }
    const auto itemsize = static_cast<int32_t>(view.itemsize);
    if ((strict && !SafeCast(kind, itemsize, type.kind, type.itemsize)) ||
        !ConvertElements(data, kind, itemsize, staged, type.kind, type.itemsize,
                         step_bytes_[f] / type.itemsize)) {
      return Refuse();
    }
    source_[f] = staged;
  }
  if ((batch_axis == kNone && with_axis) || (batch_axis == kAllOrNone && with_axis && without_axis) ||
      (batch_axis == kRequired && without_axis)) {
    return Refuse();  // the general path accepts or refuses it with a message
  }
  packed_ = true;
  return true;
}

void RowWriter::WritePacked(int64_t row, int32_t step) {
  if (!packed_) throw std::logic_error("RowWriter.write_packed without a packed step");
  const TableView& view = table_->table().view();
  if (view.step_capacity > 0) {
    Release();
    throw std::logic_error("RowWriter.write_packed: a step ring's steps are staged (stage_packed)");
  }
  if (row < 0 || row >= view.capacity || step < 0 || step >= view.max_steps) {
    Release();
    throw std::out_of_range("row " + std::to_string(row) + ", step " + std::to_string(step) +
                            " is outside the table");
  }
  for (size_t f = 0; f < types_.size(); ++f) {
    const FieldView& field = view.fields[f];
    std::memcpy(field.data + row * field.row_stride + step * field.step_bytes, source_[f],
                static_cast<size_t>(step_bytes_[f]));
  }
  Release();
}

int64_t RowWriter::Add(py::handle row, bool strict, double priority, std::optional<double> timeout,
                       int32_t batch_axis) {
  if (table_->closed()) return -2;
  if (!std::isfinite(priority) || priority < 0 || priority > FLT_MAX) return -1;
  if (priority == 0 && table_->table().queue()) return -1;  // refused by name on the general path
  if (table_->table().step_ring()) return -1;               // Table.add of a step ring inserts whole episodes
  if (!Pack(row, strict, batch_axis)) return -1;
  RateLimiter& limiter = table_->table().rate_limiter();
  std::optional<InsertReservation> reservation;  // gives the insert back if the row is not published
  if (limiter.enabled()) {
    if (!limiter.TryAdmit(RateOp::kInsert, 1)) {
      const std::shared_ptr<SharedTable> held = table_->ref();  // kept while the GIL is released
      try {
        AdmitFromPython(*table_, *held, RateOp::kInsert, 1, timeout);
      } catch (...) {
        Release();
        throw;
      }
    }
    reservation.emplace(limiter, 1);
  }
  const int64_t claimed = table_->Claim();
  WritePacked(claimed, 0);
  table_->Commit(claimed, 1, static_cast<float>(priority), reservation ? &*reservation : nullptr);
  return claimed;
}

}  // namespace gear
