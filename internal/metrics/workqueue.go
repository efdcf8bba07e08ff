package metrics

import (
	"math"
	"sort"
	"sync"
	"sync/atomic"

	"k8s.io/client-go/util/workqueue"
)

// WorkQueues holds the process's work queue metrics: the reconciler's
// queue ("volumes") and the Kubernetes controller's ("claims").
var WorkQueues = &Queues{}

// Queues collects the metrics of client-go work queues (the reconciler's
// and the Kubernetes controllers'), by queue name, for /metrics. Queues of
// the same name (one per term of leadership) share their series.
type Queues struct {
	mu sync.Mutex
	m  map[string]*queueSeries
}

type queueSeries struct {
	depth, adds, retries    atomic.Int64
	waitSum, workSum        floatSum
	waitCount, workCount    atomic.Int64
	unfinished, longestWork floatGauge
}

// floatSum adds without a lock: every worker observes twice per item.
type floatSum struct{ bits atomic.Uint64 }

func (f *floatSum) add(x float64) {
	for {
		old := f.bits.Load()
		if f.bits.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+x)) {
			return
		}
	}
}

func (f *floatSum) get() float64 { return math.Float64frombits(f.bits.Load()) }

type floatGauge struct{ bits atomic.Uint64 }

func (g *floatGauge) Set(x float64) { g.bits.Store(math.Float64bits(x)) }
func (g *floatGauge) get() float64  { return math.Float64frombits(g.bits.Load()) }

func (q *Queues) series(name string) *queueSeries {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.m == nil {
		q.m = map[string]*queueSeries{}
	}
	s, ok := q.m[name]
	if !ok {
		s = &queueSeries{}
		q.m[name] = s
	}
	return s
}

type gauge struct{ v *atomic.Int64 }

func (g gauge) Inc() { g.v.Add(1) }
func (g gauge) Dec() { g.v.Add(-1) }

type observer struct {
	sum *floatSum
	n   *atomic.Int64
}

func (o observer) Observe(x float64) { o.sum.add(x); o.n.Add(1) }

// The workqueue.MetricsProvider methods.

func (q *Queues) NewDepthMetric(name string) workqueue.GaugeMetric {
	return gauge{&q.series(name).depth}
}

func (q *Queues) NewAddsMetric(name string) workqueue.CounterMetric {
	return gauge{&q.series(name).adds}
}

func (q *Queues) NewRetriesMetric(name string) workqueue.CounterMetric {
	return gauge{&q.series(name).retries}
}

func (q *Queues) NewLatencyMetric(name string) workqueue.HistogramMetric {
	s := q.series(name)
	return observer{&s.waitSum, &s.waitCount}
}

func (q *Queues) NewWorkDurationMetric(name string) workqueue.HistogramMetric {
	s := q.series(name)
	return observer{&s.workSum, &s.workCount}
}

func (q *Queues) NewUnfinishedWorkSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return &q.series(name).unfinished
}

func (q *Queues) NewLongestRunningProcessorSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return &q.series(name).longestWork
}

// Write adds the queues' series to an exposition, labelled by queue name
// (the names client-go's own Prometheus adapter uses, under our prefix).
func (q *Queues) Write(w *Writer) {
	q.mu.Lock()
	names := make([]string, 0, len(q.m))
	for n := range q.m {
		names = append(names, n)
	}
	series := q.m
	q.mu.Unlock()
	sort.Strings(names)
	ints := func(pick func(*queueSeries) int64) map[string]int64 {
		out := map[string]int64{}
		for _, n := range names {
			out[n] = pick(series[n])
		}
		return out
	}
	floats := func(pick func(*queueSeries) float64) map[string]float64 {
		out := map[string]float64{}
		for _, n := range names {
			out[n] = pick(series[n])
		}
		return out
	}
	w.Gauge("salt_volumes_workqueue_depth", "Items waiting in the work queue.", "name",
		floats(func(s *queueSeries) float64 { return float64(s.depth.Load()) }))
	w.CounterVec("salt_volumes_workqueue_adds_total", "Items added to the work queue.", "name",
		ints(func(s *queueSeries) int64 { return s.adds.Load() }))
	w.CounterVec("salt_volumes_workqueue_retries_total", "Items queued again after a backoff.", "name",
		ints(func(s *queueSeries) int64 { return s.retries.Load() }))
	w.summary("salt_volumes_workqueue_queue_duration_seconds", "Time items waited in the queue before a worker took them.", names,
		func(n string) (float64, int64) { return series[n].waitSum.get(), series[n].waitCount.Load() })
	w.summary("salt_volumes_workqueue_work_duration_seconds", "Time workers spent on an item.", names,
		func(n string) (float64, int64) { return series[n].workSum.get(), series[n].workCount.Load() })
	w.Gauge("salt_volumes_workqueue_unfinished_work_seconds", "Seconds of work in progress not yet observed in work_duration.", "name",
		floats(func(s *queueSeries) float64 { return s.unfinished.get() }))
	w.Gauge("salt_volumes_workqueue_longest_running_processor_seconds", "Seconds the longest running worker has been at its item.", "name",
		floats(func(s *queueSeries) float64 { return s.longestWork.get() }))
}

// summary writes a summary without quantiles (sum and count), one per name.
func (w *Writer) summary(name, help string, names []string, get func(string) (float64, int64)) {
	w.printf("# HELP %s %s\n# TYPE %s summary\n", name, help, name)
	for _, n := range names {
		sum, count := get(n)
		w.printf("%s_sum{name=%s} %s\n%s_count{name=%s} %d\n", name, quote(n), num(sum), name, quote(n), count)
	}
}
