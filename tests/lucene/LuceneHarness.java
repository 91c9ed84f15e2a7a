// Ground truth from a real Lucene for tests/lucene (run: java -cp <lucene jars> LuceneHarness.java CMD IN... OUT).
//
// What OpenSearch runs, built from Lucene's own classes:
//   analyze:  the `nori` analyzer = org.apache.lucene.analysis.ko.KoreanAnalyzer() (no user dictionary,
//             DecompoundMode.DISCARD, KoreanPartOfSpeechStopFilter.DEFAULT_STOP_TAGS, reading form, lower case;
//             opensearch-project/OpenSearch plugins/analysis-nori NoriAnalyzerProvider with default settings).
//   bm25:     a `text` field analysed by nori, scored by LegacyBM25Similarity(k1 1.2, b 0.75, discount_overlaps)
//             (OpenSearch server/.../index/similarity/SimilarityProviders.createBM25Similarity, the default `BM25`),
//             queried as a `match` query does: QueryBuilder.createBooleanQuery(field, text) (SHOULD term clauses).
//   bm25pre:  the same over already analysed text (terms separated by TAB, SimplePatternSplitTokenizer): the
//             similarity alone, apart from the analysis.
//   features: a `rank_features` field = one FeatureField per feature; the `neural_sparse` query with query tokens
//             = a BooleanQuery of SHOULD FeatureField.newLinearQuery(field, token, weight) (neural-search
//             NeuralSparseQueryBuilder / rank_features' FeatureField storage).
// Input files are UTF-8 TSV: "id<TAB>text" (analyze, bm25 docs and queries) or "id<TAB>term=weight term=weight ..."
// (features; the last '=' splits term and weight). Output: "id<TAB>term<TAB>term ..." (analyze: a reading may hold a
// space, e.g. 웨이 -> "웨이 " in mecab-ko-dic) or
// "id<TAB>doc=score doc=score ..." top-k in rank order, scores as Java floats (bm25, features).
import java.io.*;
import java.nio.charset.StandardCharsets;
import java.nio.file.*;
import java.util.*;

import org.apache.lucene.analysis.Analyzer;
import org.apache.lucene.analysis.TokenStream;
import org.apache.lucene.analysis.ko.KoreanAnalyzer;
import org.apache.lucene.analysis.pattern.SimplePatternSplitTokenizer;
import org.apache.lucene.analysis.tokenattributes.CharTermAttribute;
import org.apache.lucene.document.*;
import org.apache.lucene.index.*;
import org.apache.lucene.search.*;
import org.apache.lucene.search.similarity.LegacyBM25Similarity;
import org.apache.lucene.store.ByteBuffersDirectory;
import org.apache.lucene.util.QueryBuilder;

public class LuceneHarness {
    static List<String[]> readTsv(String path) throws IOException {
        List<String[]> rows = new ArrayList<>();
        for (String line : Files.readAllLines(Paths.get(path), StandardCharsets.UTF_8)) {
            int tab = line.indexOf('\t');
            rows.add(tab < 0 ? new String[] {line, ""} : new String[] {line.substring(0, tab), line.substring(tab + 1)});
        }
        return rows;
    }

    static List<String> analyze(Analyzer analyzer, String text) throws IOException {
        List<String> out = new ArrayList<>();
        try (TokenStream ts = analyzer.tokenStream("text", text)) {
            CharTermAttribute term = ts.addAttribute(CharTermAttribute.class);
            ts.reset();
            while (ts.incrementToken()) out.add(term.toString());
            ts.end();
        }
        return out;
    }

    static void writeTop(PrintWriter w, String qid, IndexSearcher searcher, Query q, int k) throws IOException {
        TopDocs top = searcher.search(q, k);
        StringBuilder sb = new StringBuilder(qid).append('\t');
        for (ScoreDoc sd : top.scoreDocs) {
            sb.append(searcher.doc(sd.doc).get("id")).append('=').append(Float.toString(sd.score)).append(' ');
        }
        w.println(sb.toString().trim());
    }

    static Map<String, Float> features(String spec) {
        Map<String, Float> out = new LinkedHashMap<>();
        for (String pair : spec.trim().split(" ")) {
            if (pair.isEmpty()) continue;
            int eq = pair.lastIndexOf('=');
            out.put(pair.substring(0, eq), Float.parseFloat(pair.substring(eq + 1)));
        }
        return out;
    }

    public static void main(String[] args) throws Exception {
        String cmd = args[0];
        Analyzer nori = cmd.equals("bm25pre") ? new Analyzer() {
            @Override
            protected TokenStreamComponents createComponents(String field) {
                return new TokenStreamComponents(new SimplePatternSplitTokenizer("\t"));
            }
        } : new KoreanAnalyzer();
        try (PrintWriter w = new PrintWriter(new OutputStreamWriter(new FileOutputStream(args[args.length - 1]), StandardCharsets.UTF_8))) {
            if (cmd.equals("analyze")) {
                for (String[] row : readTsv(args[1])) w.println(row[0] + "\t" + String.join("\t", analyze(nori, row[1])));
                return;
            }
            int k = Integer.parseInt(args[3]);
            ByteBuffersDirectory dir = new ByteBuffersDirectory();
            IndexWriterConfig cfg = new IndexWriterConfig(nori);
            LegacyBM25Similarity sim = new LegacyBM25Similarity(1.2f, 0.75f);
            sim.setDiscountOverlaps(true);
            cfg.setSimilarity(sim);
            try (IndexWriter iw = new IndexWriter(dir, cfg)) {
                for (String[] row : readTsv(args[1])) {
                    Document doc = new Document();
                    doc.add(new StoredField("id", row[0]));
                    if (cmd.startsWith("bm25")) {
                        doc.add(new TextField("text", row[1], Field.Store.NO));
                    } else {
                        for (Map.Entry<String, Float> e : features(row[1]).entrySet()) doc.add(new FeatureField("f", e.getKey(), e.getValue()));
                    }
                    iw.addDocument(doc);
                }
                iw.forceMerge(1);  // one segment: doc ids in insertion order, ties broken by it
            }
            IndexSearcher searcher = new IndexSearcher(DirectoryReader.open(dir));
            searcher.setSimilarity(sim);
            QueryBuilder qb = new QueryBuilder(nori);
            for (String[] row : readTsv(args[2])) {
                Query q;
                if (cmd.startsWith("bm25")) {
                    q = qb.createBooleanQuery("text", row[1]);
                    if (q == null) { w.println(row[0] + "\t"); continue; }
                } else {
                    BooleanQuery.Builder b = new BooleanQuery.Builder();
                    for (Map.Entry<String, Float> e : features(row[1]).entrySet()) {
                        b.add(FeatureField.newLinearQuery("f", e.getKey(), e.getValue()), BooleanClause.Occur.SHOULD);
                    }
                    q = b.build();
                }
                writeTop(w, row[0], searcher, q, k);
            }
        }
    }
}
